"""KV bytes per token and pool tokens, against values computed by hand.

Each expected value is written out as the multiplication it comes from, so a
reader can check it without running anything.
"""

from decimal import Decimal

import pytest

from bulkhead.audit.errors import PlanInputError
from bulkhead.audit.kv_arithmetic import (
    PlanInputs,
    kv_bytes_per_token,
    kv_heads_per_rank,
    plan_capacity,
    resolve_kv_dtype,
)
from bulkhead.audit.model_config import attention_layout, load_config

GIB = 1024**3


def layout_of(config_path, name):
    return attention_layout(load_config(config_path(name)))


# (config, tp, bytes per token per rank in bf16), each worked out by hand:
HAND_COMPUTED_BF16 = [
    # Llama-3-70B: 80 layers, 8 KV heads, head_dim 8192/64 = 128.
    ("llama-3-70b", 1, 327_680),  # 2 x 80 x 8 x 128 x 2
    ("llama-3-70b", 8, 40_960),  # 2 x 80 x 1 x 128 x 2
    ("llama-3-70b", 16, 40_960),  # 8 heads < 16 ranks: replicated, still 1 head per rank
    # Qwen2.5-72B: same attention shape as Llama-3-70B; head_dim derived, not given.
    ("qwen2.5-72b", 1, 327_680),  # 2 x 80 x 8 x 128 x 2
    ("qwen2.5-72b", 4, 81_920),  # 2 x 80 x 2 x 128 x 2
    ("qwen2.5-72b", 8, 40_960),  # 2 x 80 x 1 x 128 x 2
    # GLM-4.5: 92 layers, 8 KV heads, explicit head_dim 128 (5120/96 would be 53.3).
    ("glm-4.5", 1, 376_832),  # 2 x 92 x 8 x 128 x 2
    ("glm-4.5", 8, 47_104),  # 2 x 92 x 1 x 128 x 2
    # DeepSeek-V3 (MLA): 61 layers x (512 + 64) x 2, the same on every rank.
    ("deepseek-v3", 1, 70_272),
    ("deepseek-v3", 8, 70_272),
    ("deepseek-v3", 16, 70_272),
]


@pytest.mark.parametrize(("name", "tp", "expected"), HAND_COMPUTED_BF16)
def test_kv_bytes_per_token_match_hand_computed_values(config_path, name, tp, expected):
    layout = layout_of(config_path, name)
    _, dtype_bytes = resolve_kv_dtype("auto", layout)  # all four configs say bfloat16
    assert dtype_bytes == 2
    assert kv_bytes_per_token(layout, tp, dtype_bytes) == expected


def test_layouts_are_read_from_the_configs(config_path):
    assert layout_of(config_path, "llama-3-70b").kind == "GQA"
    glm = layout_of(config_path, "glm-4.5")
    assert (glm.num_layers, glm.num_kv_heads, glm.head_dim) == (92, 8, 128)
    deepseek = layout_of(config_path, "deepseek-v3")
    assert deepseek.kind == "MLA"
    assert (deepseek.kv_lora_rank, deepseek.qk_rope_head_dim, deepseek.max_position_embeddings) == (512, 64, 163_840)


def test_fp8_kv_halves_the_bytes(config_path):
    layout = layout_of(config_path, "deepseek-v3")
    name, dtype_bytes = resolve_kv_dtype("fp8_e4m3", layout)
    assert (name, kv_bytes_per_token(layout, 8, dtype_bytes)) == ("fp8_e4m3", 35_136)  # 61 x 576 x 1


def test_mha_config_without_kv_heads_uses_every_attention_head():
    layout = attention_layout({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256})
    assert layout.kind == "MHA"
    assert kv_bytes_per_token(layout, 1, 2) == 2 * 2 * 4 * 64 * 2


@pytest.mark.parametrize(("kv_heads", "tp", "per_rank"), [(8, 1, 8), (8, 2, 4), (8, 8, 1), (8, 16, 1), (1, 4, 1)])
def test_kv_heads_split_across_ranks_or_replicate(kv_heads, tp, per_rank):
    assert kv_heads_per_rank(kv_heads, tp) == per_rank


@pytest.mark.parametrize(("kv_heads", "tp"), [(8, 3), (6, 4), (3, 8)])
def test_uneven_head_splits_are_rejected(kv_heads, tp):
    with pytest.raises(PlanInputError):
        kv_heads_per_rank(kv_heads, tp)


def inputs(layout, **overrides):
    values = dict(
        layout=layout,
        accelerator_memory_bytes=141 * GIB,
        weights_bytes=689_883_565_256,
        tp=8,
        mem_fraction=Decimal("0.9"),
        context_length=1_048_576,
        kv_dtype="bfloat16",
        kv_dtype_bytes=2,
        page_size=1,
        activation_reserve_bytes=2 * GIB,
    )
    values.update(overrides)
    return PlanInputs(**values)


def test_llama_3_70b_on_eight_80gib_accelerators(config_path):
    layout = layout_of(config_path, "llama-3-70b")
    plan = plan_capacity(
        inputs(layout, accelerator_memory_bytes=80 * GIB, weights_bytes=141_000_000_000, context_length=8192, page_size=16)
    )
    # usable   = floor(85,899,345,920 x 0.9)                      = 77,309,411,328
    # weights  = 141,000,000,000 / 8                              = 17,625,000,000
    # budget   = 77,309,411,328 - 17,625,000,000 - 2,147,483,648  = 57,536,927,680
    # tokens   = floor(57,536,927,680 / 40,960)                   =  1,404,710
    # pool     = whole pages of 16: 87,794 x 16                    =  1,404,704
    assert plan.usable_bytes == 77_309_411_328
    assert plan.weights_bytes_per_rank == 17_625_000_000
    assert plan.kv_budget_bytes == 57_536_927_680
    assert plan.pool_tokens == 1_404_704
    assert plan.holds_context and plan.shortfall_tokens == 0


def test_the_incident_shape_is_flagged(config_path):
    """A 1,048,576-token context on a pool of 681,280 tokens: what plan must catch."""
    layout = layout_of(config_path, "deepseek-v3")
    plan = plan_capacity(inputs(layout))
    # usable   = floor(151,397,597,184 x 0.9)                       = 136,257,837,465
    # weights  = 689,883,565,256 / 8                                =  86,235,445,657
    # budget   = 136,257,837,465 - 86,235,445,657 - 2,147,483,648   =  47,874,908,160
    # pool     = 47,874,908,160 / 70,272                            =         681,280
    assert plan.kv_budget_bytes == 47_874_908_160
    assert plan.pool_tokens == 681_280
    assert not plan.holds_context
    assert plan.shortfall_tokens == 367_296  # 1,048,576 - 681,280
    # One full-context request: 1,048,576 x 70,272 = 73,685,532,672 B of KV per rank;
    # with weights and reserve, 162,068,461,977 B / 0.9 -> 180,076,068,864 B per accelerator.
    assert plan.context_kv_bytes == 73_685_532_672
    assert plan.accelerator_memory_needed_bytes == 180_076_068_864


def test_the_incident_shape_holds_with_fp8_kv_or_twice_the_ranks(config_path):
    layout = layout_of(config_path, "deepseek-v3")
    fp8 = plan_capacity(inputs(layout, kv_dtype="fp8_e4m3", kv_dtype_bytes=1))
    assert fp8.pool_tokens == 1_362_560  # 47,874,908,160 / 35,136
    wider = plan_capacity(inputs(layout, tp=16))
    # weights/rank = ceil(689,883,565,256 / 16) = 43,117,722,829
    # budget = 136,257,837,465 - 43,117,722,829 - 2,147,483,648 = 90,992,630,988 -> / 70,272
    assert wider.pool_tokens == 1_294_863
    assert fp8.holds_context and wider.holds_context


def test_weights_that_do_not_fit_give_an_empty_pool(config_path):
    plan = plan_capacity(inputs(layout_of(config_path, "deepseek-v3"), tp=1))
    assert plan.kv_budget_bytes < 0
    assert plan.pool_tokens == 0 and not plan.holds_context


@pytest.mark.parametrize(
    "override",
    [{"tp": 0}, {"mem_fraction": Decimal("1.5")}, {"mem_fraction": Decimal("0")}, {"page_size": 0}, {"context_length": 0}],
)
def test_nonsense_inputs_are_rejected(config_path, override):
    with pytest.raises(PlanInputError):
        inputs(layout_of(config_path, "deepseek-v3"), **override)
