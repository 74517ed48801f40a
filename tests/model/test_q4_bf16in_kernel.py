"""Decode rows through the 4-bit grid weights with bf16 inputs and fp32 sums
under the opt-in `q4-bf16in-all` (bulkhead.model.q4_bf16in_kernel)."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bulkhead.model import bf16in_kernel, q4_bf16in_kernel, q4_kernel
from bulkhead.model.linear_kernel import choose, prepare_one
from tests.model.grid_weights import gguf_q4_1, one_layer_model
from tests.model.row_checks import assert_rows_independent

needs_q4_bf16in = pytest.mark.skipif(q4_bf16in_kernel.load() is None,
                                     reason="no AVX-512 BF16 here, or the kernel cannot be built")


def only_inputs_rounded(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in float64: x rounded to bf16 times the exact weight."""
    return F.linear(x.bfloat16().double(), w.double()).float()


def decode_rows_kernel(w):
    packed = q4_kernel.pack(w)
    return lambda x: q4_bf16in_kernel.linear_q4_nibbles(x, packed)


@needs_q4_bf16in
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 8, 9, 13, 16, 17, 64])
def test_it_rounds_the_inputs_to_bf16_and_nothing_else(rows):
    w = gguf_q4_1(96, 128)
    x = torch.randn(rows, 128)
    y = decode_rows_kernel(w)(x)
    assert y.dtype == torch.float32
    # fp32 sums of exact products: within fp32 rounding of the bf16-input answer
    # (its 128 + q loses a little more to fp32 rounding than a plain q would) ...
    torch.testing.assert_close(y, only_inputs_rounded(x, w), rtol=1e-5, atol=2e-5)
    # ... which is not the fp32 answer (so the first check is not of an fp32 kernel) ...
    assert not torch.allclose(y, F.linear(x, w), rtol=1e-5, atol=1e-5)
    # ... but near it, and nearer than a bf16 output could be.
    torch.testing.assert_close(y, F.linear(x, w), rtol=2e-2, atol=2e-2)


@needs_q4_bf16in
def test_a_rows_numbers_do_not_depend_on_its_batch_mates_or_place():
    assert_rows_independent(decode_rows_kernel(gguf_q4_1(64, 96)), torch.randn(20, 96))


def test_on_a_cpu_with_avx512_bf16_it_is_built():
    # Otherwise every needs_q4_bf16in test would skip unseen.
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    if "avx512_bf16" not in flags or q4_kernel.load() is None:
        pytest.skip("no AVX-512 BF16 here, or no C build of the 4-bit kernels at all")
    assert q4_bf16in_kernel.load() is not None


def test_without_its_build_q4_bf16in_all_is_an_error_and_auto_does_not_need_it(monkeypatch):
    auto = choose("auto", torch.float32, one_layer_model(gguf_q4_1))
    monkeypatch.setattr(q4_bf16in_kernel, "load", lambda: None)
    assert choose("auto", torch.float32, one_layer_model(gguf_q4_1)) == auto
    with pytest.raises(RuntimeError, match="q4-bf16in-all: .*AVX-512 BF16"):
        choose("q4-bf16in-all", torch.float32, one_layer_model(gguf_q4_1))


@needs_q4_bf16in
def test_the_decode_rows_kernel_passes_non_finite_input_and_refuses_shapes():
    w = gguf_q4_1(32, 64)
    x = torch.zeros(3, 64)
    x[1, 5], x[2, 40] = float("nan"), float("inf")
    y = decode_rows_kernel(w)(x)
    assert torch.isfinite(y[0]).all() and torch.isnan(y[1]).all() and not torch.isfinite(y[2]).any()
    qs = torch.zeros(2, 48, q4_bf16in_kernel.BLOCK // 2, dtype=torch.uint8)  # K = 48: not whole groups
    with pytest.raises(ValueError, match="refused"):
        q4_bf16in_kernel.linear_q4_nibbles(torch.randn(2, 48), (qs, torch.zeros(2, 2, 2, q4_bf16in_kernel.BLOCK)))


@needs_q4_bf16in
@pytest.mark.skipif(bf16in_kernel.load() is None, reason="no prompt kernel here")
def test_under_q4_bf16in_all_decode_rows_round_their_inputs_and_prompt_rows_are_q4_bf16ins():
    w = gguf_q4_1(64, 96)
    every, prompts_only = prepare_one(w, "q4-bf16in-all"), prepare_one(w, "q4-bf16in")
    x, b = torch.randn(9, 96), torch.randn(64)
    torch.testing.assert_close(every(x, b, decode=True), only_inputs_rounded(x, w) + b, rtol=1e-5, atol=2e-5)
    assert not torch.equal(every(x, b, decode=True), prompts_only(x, b, decode=True))
    assert torch.equal(every(x, b, decode=False), prompts_only(x, b, decode=False))
    assert choose("q4-bf16in-all", torch.float32, one_layer_model(gguf_q4_1)) == "q4-bf16in-all"
    assert choose("auto", torch.float32, one_layer_model(gguf_q4_1)) != "q4-bf16in-all"  # opt-in, never auto
