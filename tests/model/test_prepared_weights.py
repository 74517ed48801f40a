"""What a start computes once per machine is read back, not computed again:
the weights laid out for the default kernels (bulkhead.model.prepared_weights)
and the batch-invariance measurement (builder._decode_row_multiple)."""

import logging
from pathlib import Path

import pytest
import torch

from bulkhead.engine import builder
from bulkhead.engine.builder import EngineConfig
from bulkhead.model import linear_kernel, prepared_weights
from bulkhead.model.llama import LlamaModel
from tests.model.test_machine_cache import vm_flags


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BULKHEAD_CACHE", str(tmp_path))
    return tmp_path


def test_a_second_load_reads_the_laid_out_weights_and_they_are_the_same(smollm2_dir, fresh_cache):
    first = prepared_weights.load_laid_out(smollm2_dir, torch.float32, "auto")
    kernel = first[2]
    if not prepared_weights.cacheable(kernel, first[3]):
        pytest.skip(f"{kernel} is not cached (this CPU has no AVX-512 BF16)")
    hits = prepared_weights.stats["hits"]
    second = prepared_weights.load_laid_out(smollm2_dir, torch.float32, "auto")
    assert prepared_weights.stats["hits"] == hits + 1
    assert second[2:] == first[2:]
    a, b = first[1], second[1]
    ids = torch.arange(a.embed.shape[0])
    assert torch.equal(a.embed[ids], b.embed[ids]) and torch.equal(a.lm_head.packed[0], b.lm_head.packed[0])
    for la, lb in zip(a.layers, b.layers):
        for name in prepared_weights.LINEARS:
            wa, wb = getattr(la, name), getattr(lb, name)
            assert all(torch.equal(x, y) and x.dtype == y.dtype for x, y in zip(wa.weights, wb.weights))
            assert torch.equal(wa.prefill.wb, wb.prefill.wb) and wa.decode_inputs == wb.decode_inputs
    # The same logits from both: prompt and decode rows.
    x = torch.randn(3, a.embed.shape[1], generator=torch.Generator().manual_seed(0))
    for decode in (False, True):
        assert torch.equal(a.layers[0].gate_up(x, decode=decode), b.layers[0].gate_up(x, decode=decode))
    assert torch.equal(a.lm_head(x), b.lm_head(x))


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="no /proc/self/smaps to read the advice from")
def test_the_first_start_serves_the_weights_from_huge_pages_as_later_ones_do(smollm2_dir, fresh_cache):
    _, weights, kernel, head = prepared_weights.load_laid_out(smollm2_dir, torch.float32, "auto")
    if not prepared_weights.cacheable(kernel, head):
        pytest.skip(f"{kernel} is not cached (this CPU has no AVX-512 BF16)")
    codes = weights.layers[0].gate_up.weights[0]
    assert "hg" in vm_flags(codes.data_ptr())  # read back from the entry just written, not torch's 4 KiB pages


def test_an_asked_lm_head_kernel_is_laid_out_afresh_not_read(smollm2_dir, fresh_cache):
    writes = prepared_weights.stats["writes"]
    _, weights, kernel, head = prepared_weights.load_laid_out(smollm2_dir, torch.float32, "aten", "fp32")
    assert (kernel, head) == ("aten", "fp32") and isinstance(weights.lm_head, linear_kernel.AtenLinear)
    assert prepared_weights.stats["writes"] == writes  # the exact fp32 path is never cached


def test_the_batch_invariance_measurement_is_read_back_on_the_next_start(smollm2_dir, fresh_cache, monkeypatch,
                                                                         caplog):
    mc, weights, kernel, _ = prepared_weights.load_laid_out(smollm2_dir, torch.float32, "auto")
    model = LlamaModel(mc, weights)
    cfg = EngineConfig(model_dir=smollm2_dir, model_id="m", kv_memory_bytes=2**20, max_running=4)
    with caplog.at_level(logging.INFO, logger="bulkhead.engine.builder"):
        measured = builder._decode_row_multiple(model, cfg)
    assert "measured now" in caplog.text

    def must_not_measure(*_, **__):
        raise AssertionError("measured again although this machine's answer is cached")

    monkeypatch.setattr(builder, "invariant_row_multiple", must_not_measure)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bulkhead.engine.builder"):
        assert builder._decode_row_multiple(model, cfg) == measured
    assert "read from" in caplog.text


@pytest.fixture(scope="module")
def mixed_dir(tmp_path_factory):
    """A Q4_K_M-like GGUF: each group in its own format (gguf-i16in), a fused qkv of two."""
    from bench import checkpoints
    from bulkhead.model import gguf_import
    from tests.model.test_format_linear import MIXED
    from tests.model.test_weight_format import SHAPES

    path = checkpoints.write_gguf(tmp_path_factory.mktemp("mixed") / "mixed.gguf", "Q4_0", types=MIXED, **SHAPES)
    return gguf_import.model_dir_for(path)


@pytest.mark.parametrize("model, kernel", [("mixed_dir", "gguf-i16in"), ("bf16_dir", "bf16")])
def test_a_per_format_gguf_and_a_bf16_checkpoint_are_cached_and_served_from_huge_pages(model, kernel, request,
                                                                                      fresh_cache):
    model_dir = request.getfixturevalue(model)
    first = prepared_weights.load_laid_out(model_dir, torch.float32, "auto")
    if first[2] != kernel:
        pytest.skip(f"{kernel} does not run here (no AVX-512 BF16 or VNNI): {first[2]}")
    assert prepared_weights.cacheable(*first[2:])
    hits = prepared_weights.stats["hits"]
    second = prepared_weights.load_laid_out(model_dir, torch.float32, "auto")
    assert prepared_weights.stats["hits"] == hits + 1 and second[2:] == first[2:]
    a, b = first[1], second[1]
    assert type(a.embed) is type(b.embed) and type(a.lm_head) is type(b.lm_head)
    ids = torch.arange(a.embed.shape[0])
    assert torch.equal(a.embed[ids], b.embed[ids])
    x = torch.randn(3, a.embed.shape[1], generator=torch.Generator().manual_seed(0))
    assert torch.equal(a.lm_head(x), b.lm_head(x))
    for la, lb in zip(a.layers, b.layers):
        for name in prepared_weights.LINEARS:
            wa, wb = getattr(la, name), getattr(lb, name)
            assert type(wa) is type(wb) and getattr(wa, "format", None) == getattr(wb, "format", None)
            xs = x if name != "down" else torch.randn(3, wa.in_features, generator=torch.Generator().manual_seed(1))
            for decode in (False, True):
                assert torch.equal(wa(xs, decode=decode), wb(xs, decode=decode))
    if Path("/proc/self/smaps").exists():  # the first start's weights too: read back from the entry it wrote
        gate_up, head = a.layers[0].gate_up, a.lm_head.packed
        assert "hg" in vm_flags(getattr(gate_up, "weights", gate_up.packed)[0].data_ptr())  # codes, or bf16 pairs
        assert "hg" in vm_flags((head if isinstance(head, torch.Tensor) else head[0]).data_ptr())
