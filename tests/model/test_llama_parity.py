"""bulkhead's decoder against transformers' on the same weights.

Tolerance: 1e-4 absolute on logits for the tiny models and 1e-3 for SmolLM2
(fp32; measured max difference ~3e-5). Differences come from summation order
(fused QKV and gate/up matmuls, SDPA or the C decode kernel) and are far below
what changes a greedy token in practice.

The reduced-precision linear kernels (q4-i16in) are not the fp32
model: for them the bar is the distribution, KL(transformers || ours) per
position, and the greedy token.
"""

import functools
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bulkhead.engine.builder import PREFILL_ROW_BUCKET
from bulkhead.engine.runner import ModelRunner, RunnerConfig
from bulkhead.engine.scheduler import DecodeWork, PrefillWork, StepPlan
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.ledger import PageLedger
from bulkhead.kv.pool import KVPool
from bulkhead.model import decode_kernel
from bulkhead.model import bf16in_kernel, i16in_kernel, prefill_attention, q4_kernel
from bulkhead.model.linear_kernel import onednn_usable
from bulkhead.model.gguf_import import GGUF_POINTER
from bulkhead.model.loader import load_model
from tests.conftest import make_tiny_model


def paged_logits(model_dir, ids, chunk, kernel, decode_attention="torch", head_kernel=None, kv_dtype="float32",
                 prompt_attention="torch"):
    """Logits at each chunk end (prefill) and at each of the last 3 tokens (decode)."""
    model = load_model(model_dir, linear_kernel=kernel, decode_attention=decode_attention, head_kernel=head_kernel,
                       prefill_attention=prompt_attention)
    c = model.config
    layout = KVLayout(c.num_layers, c.num_kv_heads, c.head_dim, 16, kv_dtype)
    pool, ledger = KVPool(layout, 16, "poison"), PageLedger(16)
    # As the engine builds it: oneDNN pads prefill rows to a bucket.
    # Decode rows padded, not tiled (one request: the same numbers), so that
    # q4 with C attention takes the C decode layers as the engine runs them.
    runner = ModelRunner(model, pool, ledger, RunnerConfig(prefill_row_bucket=0 if kernel == "aten"
                                                           else PREFILL_ROW_BUCKET, decode_row_multiple=1))
    pages = tuple(ledger.allocate("r", "t", layout.pages_for_tokens(len(ids))))
    out = {}
    prefill_len = len(ids) - 3
    for start in range(0, prefill_len, chunk):
        end = min(prefill_len, start + chunk)
        _, logits = runner.run(StepPlan(PrefillWork("r", "t", start, tuple(ids[start:end]), pages, True), (), ()))
        out[end - 1] = logits[0]
    for pos in range(prefill_len, len(ids)):
        _, logits = runner.run(StepPlan(None, (DecodeWork("r", "t", pos, ids[pos], pages),), ()))
        out[pos] = logits[0]
    return out


def reference_logits(model_dir, ids):
    with torch.no_grad():
        return _reference_model(str(model_dir))(torch.tensor([ids])).logits[0]


@functools.lru_cache(maxsize=1)
def _reference_model(model_dir: str):
    """transformers' model of a checkpoint directory, or of the GGUF file a
    served directory points at (the bundled model: bulkhead reads its tensors
    from the file, and transformers dequantizes the same file); loaded once."""
    from transformers import AutoModelForCausalLM

    pointer = Path(model_dir) / GGUF_POINTER
    if pointer.exists():
        gguf = Path(json.loads(pointer.read_text())["gguf"])
        return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def assert_parity(model_dir, ids, chunk, atol, kernel="aten", decode_attention="torch"):
    ours = paged_logits(model_dir, ids, chunk, kernel, decode_attention)
    ref = reference_logits(model_dir, ids)
    for pos, logits in ours.items():
        diff = (logits - ref[pos]).abs().max().item()
        assert diff < atol, f"position {pos}: max |diff| {diff}"
        assert logits.argmax() == ref[pos].argmax()


IDS = list(range(100, 140))

# The serving default is oneDNN over laid-out weights where the build has it
# (bulkhead.model.linear_kernel); the tiny-model matrix runs F.linear.
KERNELS = ["aten", pytest.param("onednn", marks=pytest.mark.skipif(
    not onednn_usable(torch.float32), reason="this torch build has no oneDNN linear"))]


@pytest.mark.parametrize(
    "model_type,overrides",
    [
        ("llama", {}),
        ("llama", {"tie_word_embeddings": False, "attention_bias": True}),
        ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                   "rope_theta": 500000.0}),
        ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
        ("qwen2", {}),
        ("mistral", {"sliding_window": None}),
    ],
    ids=["llama-tied", "llama-untied-bias", "llama3-rope", "linear-rope", "qwen2", "mistral"],
)
def test_tiny_models_match_transformers(tmp_path, smollm2_dir, model_type, overrides):
    model_dir = make_tiny_model(tmp_path, smollm2_dir, model_type, **overrides)
    assert_parity(model_dir, IDS, chunk=16, atol=1e-4)


def q4_usable_here() -> bool:
    return q4_kernel.load() is not None and onednn_usable(torch.float32)


needs_c = pytest.mark.skipif(decode_kernel.load(64, 3, 16) is None, reason="no C compiler for the decode kernel")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("decode_attention", ["torch", pytest.param("c", marks=needs_c)])
def test_smollm2_matches_transformers(smollm2_dir, kernel, decode_attention):
    assert_parity(smollm2_dir, IDS, chunk=13, atol=1e-3, kernel=kernel, decode_attention=decode_attention)


@pytest.mark.skipif(not q4_usable_here(), reason="the 4-bit kernel cannot be built here")
@pytest.mark.parametrize("decode_attention", ["torch", pytest.param("c", marks=needs_c)])
def test_smollm2_through_the_4_bit_kernel_is_the_exact_model(smollm2_dir, decode_attention):
    # q4 rebuilds the Q4_1 weights bit for bit and sums in fp32: with the fp32
    # lm_head its decode rows are the exact model's, to the same tolerance.
    ours = paged_logits(smollm2_dir, IDS, 13, "q4", decode_attention, head_kernel="fp32")
    ref = reference_logits(smollm2_dir, IDS)
    for pos, logits in ours.items():
        assert (logits - ref[pos]).abs().max().item() < 1e-3, pos
        assert logits.argmax() == ref[pos].argmax(), pos


@pytest.mark.parametrize("decode_attention", ["torch", pytest.param("c", marks=needs_c)])
def test_smollm2_on_a_bf16_kv_cache_keeps_the_distribution(smollm2_dir, decode_attention):
    # K and V rounded to bf16 as they are stored; chunks after the first and
    # decode rows read them back widened (both attention paths).
    ours = paged_logits(smollm2_dir, IDS, 13, "aten", decode_attention, kv_dtype="bfloat16")
    ref = reference_logits(smollm2_dir, IDS)
    for pos, logits in ours.items():
        kl = F.kl_div(logits.log_softmax(-1), ref[pos].log_softmax(-1), log_target=True, reduction="sum").item()
        assert kl < 0.01, f"position {pos}: KL {kl:.4f}"
        assert logits.argmax() == ref[pos].argmax(), pos
    assert not torch.equal(ours[len(IDS) - 1], paged_logits_fp32(smollm2_dir)[len(IDS) - 1])  # it really rounded


@pytest.mark.parametrize("kernel,max_kl", [
    # Prompts' inputs and weights rounded to bf16, decode rows' inputs as 16-bit integers per group.
    pytest.param("q4-i16in", 0.01, marks=pytest.mark.skipif(
        not (q4_usable_here() and bf16in_kernel.load() and i16in_kernel.load()),
        reason="no AVX-512 BF16 or VNNI, or no 4-bit kernel here")),
])
def test_smollm2_on_a_reduced_precision_kernel_keeps_the_distribution(smollm2_dir, kernel, max_kl):
    # Prompts' attention as the engine picks it for this kernel (bf16 beside q4-i16in).
    ours = paged_logits(smollm2_dir, IDS, 13, kernel, "c" if decode_kernel.load(64, 3, 16) else "torch",
                        prompt_attention=prefill_attention.choose("auto", kernel, 64))
    ref = reference_logits(smollm2_dir, IDS)
    for pos, logits in ours.items():
        kl = F.kl_div(logits.log_softmax(-1), ref[pos].log_softmax(-1), log_target=True, reduction="sum").item()
        assert kl < max_kl, f"position {pos}: KL {kl:.4f}"
        assert logits.argmax() == ref[pos].argmax(), pos
        assert not torch.equal(logits, paged_logits_fp32(smollm2_dir)[pos])  # it really ran reduced


@functools.cache
def paged_logits_fp32(model_dir):
    return paged_logits(model_dir, IDS, 13, "aten")


@pytest.mark.parametrize("kernel", KERNELS[1:])  # aten: the qwen2 case above
def test_a_tiny_model_with_biases_matches_transformers_on_onednn(tmp_path, smollm2_dir, kernel):
    model_dir = make_tiny_model(tmp_path, smollm2_dir, "qwen2")  # qkv bias
    assert_parity(model_dir, IDS, chunk=16, atol=1e-4, kernel=kernel)


def test_unsupported_rope_is_refused(tmp_path, smollm2_dir):
    from bulkhead.model.config import UnsupportedModel, load_model_config

    model_dir = make_tiny_model(tmp_path, smollm2_dir, "llama", rope_scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(UnsupportedModel, match="yarn"):
        load_model_config(model_dir)
