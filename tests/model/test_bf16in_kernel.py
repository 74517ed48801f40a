"""The prompt kernel: bf16 weights and inputs, fp32 sums and outputs
(bulkhead.model.bf16in_kernel)."""

import ctypes
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bulkhead.model import bf16in_kernel, i16in_kernel, prefill_glue, q4_kernel
from bulkhead.model.linear_kernel import AtenLinear, BF16InLinear, choose, prepare_one
from tests.model.grid_weights import gguf_q4_1, one_layer_model
from tests.model.row_checks import assert_rows_independent

needs_bf16in = pytest.mark.skipif(bf16in_kernel.load() is None,
                                  reason="no AVX-512 BF16 here, or the kernel cannot be built")


def run(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return bf16in_kernel.linear_bf16in(x, bf16in_kernel.pack(w))


def both_rounded(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in float64: x and w rounded to bf16, nothing else."""
    return F.linear(x.bfloat16().double(), w.bfloat16().double()).float()


@needs_bf16in
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 12, 13, 16, 17, 64])
def test_it_rounds_inputs_and_weights_to_bf16_and_nothing_else(rows):
    w = gguf_q4_1(96, 128)
    x = torch.randn(rows, 128)
    y = run(x, w)
    assert y.dtype == torch.float32
    # fp32 sums of exact products: within fp32 rounding of the answer with both operands rounded ...
    torch.testing.assert_close(y, both_rounded(x, w), rtol=1e-5, atol=1e-5)
    # ... which is neither the answer with only the inputs rounded (the weights are rounded too) ...
    assert not torch.allclose(y, F.linear(x.bfloat16().double(), w.double()).float(), rtol=1e-5, atol=1e-5)
    # ... nor the fp32 answer, but near it, and nearer than a bf16 output could be.
    assert not torch.allclose(y, F.linear(x, w), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y, F.linear(x, w), rtol=2e-2, atol=2e-2)
    assert not torch.equal(y, y.bfloat16().float())


@needs_bf16in
@pytest.mark.parametrize("k", [2, 66, 2048])
def test_any_even_number_of_inputs_is_taken(k):
    # Not only whole groups of 32: the weight is bf16, no group scales; and a
    # long row sums in one register over all of K.
    w, x = torch.randn(64, k), torch.randn(7, k)
    torch.testing.assert_close(bf16in_kernel.linear_bf16in(x, bf16in_kernel.pack(w)), both_rounded(x, w),
                               rtol=1e-5, atol=1e-5 * k ** 0.5)


@needs_bf16in
def test_a_rows_numbers_do_not_depend_on_its_batch_mates_or_place():
    wb = bf16in_kernel.pack(gguf_q4_1(64, 96))
    assert_rows_independent(lambda x: bf16in_kernel.linear_bf16in(x, wb), torch.randn(20, 96))


def test_on_a_cpu_with_avx512_bf16_it_is_built():
    # Otherwise every needs_bf16in test would skip, and the default fall back to fp32 prompts unseen.
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    if "avx512_bf16" not in flags or q4_kernel.load() is None:
        pytest.skip("no AVX-512 BF16 here, or no C build of the kernels at all")
    assert bf16in_kernel.load() is not None


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
    with pytest.raises(ValueError, match="multiple of 32"):
        bf16in_kernel.pack(torch.randn(48, 64))
    with pytest.raises(ValueError, match="K even"):
        bf16in_kernel.pack(torch.randn(64, 63))
    # The C side's own checks: outputs not a whole number of blocks, an odd K, no rows.
    lib = bf16in_kernel.load()
    x, wb = torch.randn(2, 65), torch.zeros(64 * 65, dtype=torch.bfloat16)
    xb, y = torch.empty(2, 65, dtype=torch.bfloat16), torch.empty(2, 64)
    pointers = [ctypes.c_void_p(t.data_ptr()) for t in (x, wb, xb, y)]
    assert lib.linear_bf16in(*pointers, 2, 48, 64, 1) == -1
    assert lib.linear_bf16in(*pointers, 2, 64, 65, 1) == -1
    assert lib.linear_bf16in(*pointers, 0, 64, 64, 1) == -1
    assert lib.linear_bf16in(*pointers, 2, 64, 64, 1) == 0


@needs_bf16in
def test_prompt_rows_take_it():
    w = gguf_q4_1(64, 96)
    fast = prepare_one(w, "q4-i16in") if i16in_kernel.load() is not None else BF16InLinear(bf16in_kernel.pack(w))
    assert isinstance(fast, BF16InLinear) or isinstance(fast.prefill, BF16InLinear)
    x, b = torch.randn(9, 96), torch.randn(64)
    torch.testing.assert_close(fast(x, b, decode=False), both_rounded(x, w) + b, rtol=1e-5, atol=1e-5)


@needs_bf16in
@pytest.mark.skipif(prefill_glue.load() is None, reason="the C prompt glue cannot be built here")
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 9, 64])
def test_gate_up_with_silu_in_one_pass_gives_the_down_projection_the_two_passes_numbers(rows):
    wb = bf16in_kernel.pack(gguf_q4_1(128, 96))  # gate: outputs 0-63, up: 64-127
    down = bf16in_kernel.pack(gguf_q4_1(96, 64))
    x = torch.randn(rows, 96) * 3
    if rows > 2:
        x[0, 7] = float("nan")  # stays in its row
    act = bf16in_kernel.linear_bf16in_silu_mul(x, wb)
    assert act.shape == (rows, 64) and act.dtype == torch.bfloat16
    separate = prefill_glue.silu_mul(bf16in_kernel.linear_bf16in(x, wb))
    # act is the two passes' product rounded to bf16 (a NaN as a NaN) ...
    torch.testing.assert_close(act, separate.bfloat16(), rtol=0, atol=0, equal_nan=True)
    # ... and the down projection reads it as it is: bit for bit its numbers from the fp32 product.
    torch.testing.assert_close(bf16in_kernel.linear_bf16in(act, down), bf16in_kernel.linear_bf16in(separate, down),
                               rtol=0, atol=0, equal_nan=True)
    if rows > 2:
        assert act[0].isnan().all() and not act[1:].isnan().any()
    gate, up = F.linear(x.bfloat16().double(), gguf_q4_1(128, 96).bfloat16().double()).float().chunk(2, dim=-1)
    torch.testing.assert_close(act[1:].float(), (F.silu(gate) * up)[1:], rtol=1e-2, atol=1e-2)


@needs_bf16in
def test_gate_up_with_silu_keeps_each_rows_numbers_its_own():
    wb = bf16in_kernel.pack(gguf_q4_1(128, 96))
    assert_rows_independent(lambda x: bf16in_kernel.linear_bf16in_silu_mul(x, wb), torch.randn(11, 96))


@needs_bf16in
def test_a_gate_up_whose_halves_are_not_whole_blocks_has_no_one_pass_form():
    odd = prepare_one(gguf_q4_1(96, 64), "q4-i16in")  # three blocks of 32: gate and up would split one
    assert odd.silu_mul(torch.randn(2, 64)) is None
    with pytest.raises(ValueError, match="odd number"):
        bf16in_kernel.linear_bf16in_silu_mul(torch.randn(2, 64), bf16in_kernel.pack(gguf_q4_1(96, 64)))
    lib = bf16in_kernel.load()  # the C side's own check: I not a whole number of blocks
    x, wb = torch.randn(2, 64), torch.zeros(96 * 64, dtype=torch.bfloat16)
    xb, act = torch.empty(2, 64, dtype=torch.bfloat16), torch.empty(2, 48, dtype=torch.bfloat16)
    pointers = [ctypes.c_void_p(t.data_ptr()) for t in (x, wb, xb, act)]
    assert lib.linear_bf16in_silu_mul(*pointers, 2, 48, 64, 1) == -1
    assert lib.linear_bf16in_silu_mul(*pointers, 2, 32, 64, 1) == 0
    xb_ptr, wb_ptr, y_ptr = pointers[2], pointers[1], ctypes.c_void_p(torch.empty(2, 48).data_ptr())
    assert lib.linear_bf16in_rounded(xb_ptr, wb_ptr, y_ptr, 2, 48, 64, 1) == -1  # rounded rows' call: the same rule
    assert AtenLinear(torch.randn(64, 64)).silu_mul(torch.randn(2, 64)) is None  # kernels without one


def test_without_avx512_bf16_auto_keeps_fp32_prompts_and_asking_for_it_is_an_error(monkeypatch):
    monkeypatch.setattr(bf16in_kernel, "load", lambda: None)
    if q4_kernel.load() is not None:
        assert choose("auto", torch.float32, one_layer_model(gguf_q4_1)) == "q4"
    with pytest.raises(RuntimeError, match="q4-i16in: .*AVX-512 BF16"):
        choose("q4-i16in", torch.float32, one_layer_model(gguf_q4_1))
