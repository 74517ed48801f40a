"""The prompt kernel over 4-bit grid weights with bf16 inputs and fp32 sums
(bulkhead.model.q4_bf16in_kernel)."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bulkhead.model import q4_bf16in_kernel, q4_kernel
from bulkhead.model.linear_kernel import Q4BF16InLinear, Q4Linear, choose, prepare_one
from tests.model.grid_weights import gguf_q4_1, one_layer_model

needs_bf16in = pytest.mark.skipif(q4_bf16in_kernel.load() is None,
                                  reason="no AVX-512 BF16 here, or the kernel cannot be built")


def run(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return q4_bf16in_kernel.linear_q4_bf16in(x, q4_bf16in_kernel.pack_q(w), q4_kernel.pack(w)[1])


def only_inputs_rounded(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in float64: x rounded to bf16 times the exact weight."""
    return F.linear(x.bfloat16().double(), w.double()).float()


def prompt_rows_kernel(w):
    qb, dm = q4_bf16in_kernel.pack_q(w), q4_kernel.pack(w)[1]
    return lambda x: q4_bf16in_kernel.linear_q4_bf16in(x, qb, dm)


def decode_rows_kernel(w):
    packed = q4_kernel.pack(w)
    return lambda x: q4_bf16in_kernel.linear_q4_nibbles(x, packed)


# The decode-rows kernel's 128 + q loses a little more to fp32 rounding than the prompt kernel's plain q.
@needs_bf16in
@pytest.mark.parametrize("make,atol", [(prompt_rows_kernel, 1e-5), (decode_rows_kernel, 2e-5)],
                         ids=["prompt-rows", "decode-rows"])
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 8, 9, 13, 16, 17, 64])
def test_it_rounds_the_inputs_to_bf16_and_nothing_else(make, atol, rows):
    w = gguf_q4_1(96, 128)
    x = torch.randn(rows, 128)
    y = make(w)(x)
    assert y.dtype == torch.float32
    # fp32 sums of exact products: within fp32 rounding of the bf16-input answer ...
    torch.testing.assert_close(y, only_inputs_rounded(x, w), rtol=1e-5, atol=atol)
    # ... which is not the fp32 answer (so the first check is not of an fp32 kernel) ...
    assert not torch.allclose(y, F.linear(x, w), rtol=1e-5, atol=1e-5)
    # ... but near it, and nearer than a bf16 output could be.
    torch.testing.assert_close(y, F.linear(x, w), rtol=2e-2, atol=2e-2)


@needs_bf16in
@pytest.mark.parametrize("make", [prompt_rows_kernel, decode_rows_kernel], ids=["prompt-rows", "decode-rows"])
def test_a_rows_numbers_do_not_depend_on_its_batch_mates_or_place(make):
    run_rows = make(gguf_q4_1(64, 96))
    x = torch.randn(20, 96)
    alone = torch.cat([run_rows(x[i : i + 1]) for i in range(20)])
    for m in range(1, 21):
        assert torch.equal(run_rows(x[:m]), alone[:m])
    assert torch.equal(run_rows(x.roll(5, 0)), alone.roll(5, 0))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(run_rows(x), alone)
    finally:
        torch.set_num_threads(threads)


def test_on_a_cpu_with_avx512_bf16_it_is_built():
    # Otherwise every needs_bf16in test would skip, and the default fall back to fp32 prompts unseen.
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    if "avx512_bf16" not in flags or q4_kernel.load() is None:
        pytest.skip("no AVX-512 BF16 here, or no C build of the 4-bit kernels at all")
    assert q4_bf16in_kernel.load() is not None


@needs_bf16in
def test_non_finite_input_reaches_the_output():
    w = gguf_q4_1(32, 64)
    x = torch.zeros(4, 64)
    x[1, 5], x[2, 40] = float("nan"), float("inf")
    # A NaN whose low mantissa bits alone are set rounds to inf unless the
    # rounding keeps NaN apart; input 1 of each group has q = 15 for every
    # output, so an inf there would give some outputs inf, not NaN.
    x[3, 1] = torch.tensor([0x7F800001], dtype=torch.int32).view(torch.float32)
    y = run(x, w)
    assert torch.isfinite(y[0]).all() and torch.isnan(y[1]).all() and not torch.isfinite(y[2]).any()
    assert torch.isnan(y[3]).all()


@needs_bf16in
def test_shapes_it_does_not_take_are_refused():
    w = gguf_q4_1(64, 96)
    with pytest.raises(ValueError, match="float32"):
        run(torch.randn(2, 64), w)
    assert q4_bf16in_kernel.pack_q(w + 1e-4 * torch.randn(w.shape)) is None  # off the grid
    # The C side's own check: inputs not a whole number of groups of 32.
    qb = torch.zeros(2, 24, q4_bf16in_kernel.BLOCK, 2, dtype=torch.bfloat16)  # K = 48
    with pytest.raises(ValueError, match="refused"):
        q4_bf16in_kernel.linear_q4_bf16in(torch.randn(2, 48), qb, torch.zeros(2, 2, 2, q4_bf16in_kernel.BLOCK))


@needs_bf16in
def test_prompt_rows_take_it_and_decode_rows_stay_q4():
    w = gguf_q4_1(64, 96)
    fast, exact = prepare_one(w, "q4-bf16in"), prepare_one(w, "q4")
    assert isinstance(fast, Q4Linear) and isinstance(fast.prefill, Q4BF16InLinear)
    x, b = torch.randn(9, 96), torch.randn(64)
    assert torch.equal(fast(x, b, decode=True), exact(x, b, decode=True))
    torch.testing.assert_close(fast(x, b, decode=False), only_inputs_rounded(x, w) + b, rtol=1e-5, atol=1e-5)


def test_without_avx512_bf16_auto_keeps_fp32_prompts_and_asking_for_it_is_an_error(monkeypatch):
    monkeypatch.setattr(q4_bf16in_kernel, "load", lambda: None)
    if q4_kernel.load() is not None:
        assert choose("auto", torch.float32, one_layer_model(gguf_q4_1)) == "q4"
    with pytest.raises(RuntimeError, match="q4-bf16in: .*AVX-512 BF16"):
        choose("q4-bf16in", torch.float32, one_layer_model(gguf_q4_1))
    with pytest.raises(RuntimeError, match="q4-bf16in-all: .*AVX-512 BF16"):
        choose("q4-bf16in-all", torch.float32, one_layer_model(gguf_q4_1))


@needs_bf16in
def test_the_decode_rows_kernel_passes_non_finite_input_and_refuses_shapes():
    w = gguf_q4_1(32, 64)
    x = torch.zeros(3, 64)
    x[1, 5], x[2, 40] = float("nan"), float("inf")
    y = decode_rows_kernel(w)(x)
    assert torch.isfinite(y[0]).all() and torch.isnan(y[1]).all() and not torch.isfinite(y[2]).any()
    qs = torch.zeros(2, 48, q4_bf16in_kernel.BLOCK // 2, dtype=torch.uint8)  # K = 48: not whole groups
    with pytest.raises(ValueError, match="refused"):
        q4_bf16in_kernel.linear_q4_nibbles(torch.randn(2, 48), (qs, torch.zeros(2, 2, 2, q4_bf16in_kernel.BLOCK)))


@needs_bf16in
def test_under_q4_bf16in_all_decode_rows_round_their_inputs_and_prompt_rows_are_q4_bf16ins():
    w = gguf_q4_1(64, 96)
    every, prompts_only = prepare_one(w, "q4-bf16in-all"), prepare_one(w, "q4-bf16in")
    x, b = torch.randn(9, 96), torch.randn(64)
    torch.testing.assert_close(every(x, b, decode=True), only_inputs_rounded(x, w) + b, rtol=1e-5, atol=2e-5)
    assert not torch.equal(every(x, b, decode=True), prompts_only(x, b, decode=True))
    assert torch.equal(every(x, b, decode=False), prompts_only(x, b, decode=False))
    assert choose("q4-bf16in-all", torch.float32, one_layer_model(gguf_q4_1)) == "q4-bf16in-all"
    assert choose("auto", torch.float32, one_layer_model(gguf_q4_1)) != "q4-bf16in-all"  # opt-in, never auto
