"""A prompt pass's glue in C (bulkhead.model.prefill_glue): each op against
torch's, rows independent of each other and of the thread count, bad input
refused, and a prompt pass's logits with it against the torch ops'."""

import pytest
import torch
import torch.nn.functional as F

from bulkhead.engine.runner import ModelRunner, RunnerConfig
from bulkhead.engine.scheduler import PrefillWork, StepPlan
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.ledger import PageLedger
from bulkhead.kv.pool import KVPool
from bulkhead.model import prefill_glue
from bulkhead.model.llama import LlamaModel
from bulkhead.model.loader import load_model
from bulkhead.model.rope import apply_rope, rope_tables
from bulkhead.model.config import RopeConfig

needs_c = pytest.mark.skipif(prefill_glue.load() is None, reason="the C prompt glue cannot be built here")


def with_threads(n, fn):
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(n)
        return fn()
    finally:
        torch.set_num_threads(old)


@needs_c
def test_rms_norm_and_the_residual_add_match_torch():
    x, delta, w = torch.randn(37, 576), torch.randn(37, 576), torch.rand(576) + 0.5
    h = prefill_glue.rms_norm(x, w, 1e-5)
    torch.testing.assert_close(h, F.rms_norm(x, (576,), w, 1e-5), rtol=2e-6, atol=2e-6)
    expected_x = x + delta
    h2 = prefill_glue.add_rms_norm(x, delta, w, 1e-5)
    assert torch.equal(x, expected_x)  # the add is torch's own, in place
    torch.testing.assert_close(h2, F.rms_norm(expected_x, (576,), w, 1e-5), rtol=2e-6, atol=2e-6)


@needs_c
def test_silu_mul_matches_torch_and_keeps_nan_in_its_row():
    gate_up = torch.randn(9, 2 * 1536) * 6
    gate_up[4, 7] = float("nan")
    act = prefill_glue.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, -1)
    expected = F.silu(gate) * up
    torch.testing.assert_close(act[torch.arange(9) != 4], expected[torch.arange(9) != 4], rtol=1e-5, atol=1e-6)
    assert torch.isnan(act[4, 7]) and torch.isfinite(act[torch.arange(9) != 4]).all()


@needs_c
def test_rotary_is_torchs_bit_for_bit_and_refuses_a_position_outside_its_tables():
    cos, sin = rope_tables(RopeConfig(theta=100000.0), 64, 300)
    qkv = torch.randn(40, 12 * 64 + 3 * 64)
    positions = torch.randint(0, 300, (40,))
    ours = prefill_glue.rope(qkv, 12, 64, positions, cos, sin)
    theirs = apply_rope(qkv[:, : 12 * 64].view(-1, 12, 64), cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))
    assert torch.equal(ours, theirs)
    positions[17] = 300
    with pytest.raises(ValueError, match="outside the rotary tables"):
        prefill_glue.rope(qkv, 12, 64, positions, cos, sin)


@needs_c
def test_a_rows_numbers_do_not_depend_on_the_other_rows_or_the_threads():
    x, delta, w = torch.randn(33, 576), torch.randn(33, 576), torch.rand(576)
    gate_up, qkv = torch.randn(33, 2 * 64), torch.randn(33, 5 * 64)
    positions = torch.randint(0, 100, (33,))
    cos, sin = rope_tables(RopeConfig(theta=10000.0), 64, 100)
    ops = {"rms_norm": lambda a: prefill_glue.rms_norm(x[a].contiguous(), w, 1e-5),
           "add_rms_norm": lambda a: prefill_glue.add_rms_norm(x[a].clone(), delta[a].contiguous(), w, 1e-5),
           "silu_mul": lambda a: prefill_glue.silu_mul(gate_up[a].contiguous()),
           "rope": lambda a: prefill_glue.rope(qkv[a].contiguous(), 4, 64, positions[a], cos, sin)}
    for name, op in ops.items():
        alone = torch.cat([op(slice(i, i + 1)) for i in range(33)])
        for threads in (1, 2):
            assert torch.equal(with_threads(threads, lambda: op(slice(None))), alone), (name, threads)


@needs_c
def test_tensors_it_does_not_take_are_refused():
    with pytest.raises(ValueError, match="contiguous float32"):
        prefill_glue.rms_norm(torch.randn(4, 8).double(), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="contiguous float32"):
        prefill_glue.silu_mul(torch.randn(8, 4).t())
    with pytest.raises(ValueError, match="does not match"):
        prefill_glue.add_rms_norm(torch.randn(4, 8), torch.randn(3, 8), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="does not match"):  # a norm weight of another width
        prefill_glue.rms_norm(torch.randn(4, 8), torch.ones(6), 1e-5)
    with pytest.raises(ValueError, match="two halves"):
        prefill_glue.silu_mul(torch.randn(4, 7))
    cos, sin = rope_tables(RopeConfig(theta=10000.0), 64, 10)
    with pytest.raises(ValueError, match="do not fit"):  # more heads than qkv holds
        prefill_glue.rope(torch.randn(3, 2 * 64), 3, 64, torch.zeros(3, dtype=torch.int64), cos, sin)
    with pytest.raises(ValueError, match="do not fit"):  # tables of another head_dim
        prefill_glue.rope(torch.randn(3, 2 * 32), 2, 32, torch.zeros(3, dtype=torch.int64), cos, sin)


def test_choose(monkeypatch):
    assert prefill_glue.choose("torch", "q4-i16in") == "torch"
    # The exact kernels keep the exact model's own ops unless asked.
    assert prefill_glue.choose("auto", "onednn") == prefill_glue.choose("auto", "aten") == "torch"
    if prefill_glue.load() is not None:
        assert prefill_glue.choose("auto", "q4-i16in") == prefill_glue.choose("c", "onednn") == "c"
    with pytest.raises(ValueError, match="prefill glue must be one of"):
        prefill_glue.choose("fast", "q4")
    assert prefill_glue.choose("auto", "q4-i16in", torch.bfloat16) == "torch"  # the C ops take float32
    monkeypatch.setattr(prefill_glue, "load", lambda: None)
    assert prefill_glue.choose("auto", "q4-i16in") == "torch"
    with pytest.raises(RuntimeError, match="--prefill-glue c"):
        prefill_glue.choose("c", "q4")


def prompt_logits(model, prompts):
    c = model.config
    layout = KVLayout(c.num_layers, c.num_kv_heads, c.head_dim, 16, "bfloat16")
    pool, ledger = KVPool(layout, 40, "poison"), PageLedger(40)
    runner = ModelRunner(model, pool, ledger, RunnerConfig(prefill_row_bucket=32, decode_row_multiple=1))
    works = tuple(PrefillWork(f"r{i}", "t", 0, tuple(ids), tuple(ledger.allocate(f"r{i}", "t", 8)), True)
                  for i, ids in enumerate(prompts))
    _, logits = runner.run(StepPlan(works, (), ()))
    return torch.stack(list(logits)), pool.data.clone()


@needs_c
def test_a_prompt_pass_with_it_gives_the_torch_ops_logits_and_kv(smollm2_dir):
    model = load_model(smollm2_dir, linear_kernel="onednn", prefill_glue="c")
    twin = LlamaModel(model.config, model.weights, "torch", "torch", "torch", "torch")
    prompts = [list(range(100, 160)), list(range(2000, 2017))]
    ours, our_kv = prompt_logits(model, prompts)
    theirs, their_kv = prompt_logits(twin, prompts)
    # RMSNorm's sum and SiLU's exp differ in their last bits: the logits by far less than a token's margin.
    assert (ours - theirs).abs().max().item() < 2e-3 and torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert not torch.equal(ours, theirs)  # so the C ops ran
    # K and V were written where the torch path writes them (and nowhere else), with close values.
    written = ~their_kv.isnan()
    assert torch.equal(our_kv.isnan(), their_kv.isnan()) and written.any()
    torch.testing.assert_close(our_kv[written].float(), their_kv[written].float(), rtol=0.02, atol=0.05)
    with pytest.raises(ValueError, match="prefill glue must be c or torch"):
        LlamaModel(model.config, model.weights, "torch", "torch", "torch", "auto")
