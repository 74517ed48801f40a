"""The kernels with inputs as 16-bit integers per group of 32 and exact
integer sums (bulkhead.model.i16in_kernel): decode rows over 4-bit grid
weights, and the lm_head over 8-bit ones."""

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bulkhead.model import bf16in_kernel, i16in_kernel, q4_kernel
from bulkhead.model.format_linear import CodedLinear
from bulkhead.model.linear_kernel import BF16InLinear, Q8I16InLinear, choose, choose_head, prepare, \
    prepare_one
from tests.model.grid_weights import gguf_q4_1, gguf_q8_0, one_layer_model
from tests.model.row_checks import assert_rows_independent
from tests.model import kernel_calls

needs_i16in = pytest.mark.skipif(i16in_kernel.load() is None or q4_kernel.load() is None,
                                 reason="no AVX-512 VNNI here, or the kernels cannot be built")
GROUP = q4_kernel.GROUP


def run(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return kernel_calls.linear_q4_i16in(x, kernel_calls.i16in_pack_q4(w))


def what_it_computes(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The kernel's answer in float64: each group's inputs quantized as the C
    file does (fp32 scale max |x| / 32767, i = round(x * (32767 / max |x|)))
    times the exact q * d, plus m times the exact inputs' sum."""
    q, d, m = q4_kernel.grid(w)  # [N, K/G, G], [N, K/G, 1], [N, K/G, 1]
    groups = x.reshape(x.shape[0], -1, GROUP)
    amax = groups.abs().amax(-1, keepdim=True)
    # (torch's 32767 / amax is 32767 * (1 / amax), two roundings: divide as C does.)
    i = torch.round(groups * (torch.full_like(amax, 32767) / amax)).clamp(-32767, 32767)
    xq = (i.double() * (amax / 32767).double()).reshape(x.shape)
    qd = (q.double() * d.double()).reshape(w.shape)
    return F.linear(xq, qd) + F.linear(x.double(), m.double().expand_as(q).reshape(w.shape))


@needs_i16in
@pytest.mark.parametrize("rows", [1, 2, 5, 7, 8, 9, 13, 16, 17, 33])
def test_it_quantizes_the_inputs_per_group_and_nothing_else(rows):
    w = gguf_q4_1(96, 128)
    x = torch.randn(rows, 128)
    x[:, 7] *= 40  # an outlier in one group: its step is 40 times the others'
    y = run(x, w)
    assert y.dtype == torch.float32
    # Exact integer sums and fp32 scales: within fp32 rounding of the quantized inputs' answer
    # (|y| reaches ~20 here, and m times a group's fp32 sum of x rounds by up to ~1e-5) ...
    model, exact = what_it_computes(x, w), F.linear(x.double(), w.double())
    torch.testing.assert_close(y.double(), model, rtol=1e-5, atol=1e-4)
    # ... which is not the exact answer, so the check above tells the quantization from fp32 sums ...
    assert (y.double() - model).abs().max() * 5 < (model - exact).abs().max()
    # ... but nearer it than bf16 inputs land: about twenty times here, at least five.
    bf16_error = (F.linear(x.bfloat16().double(), w.double()) - exact).norm()
    assert (y.double() - exact).norm() * 5 < bf16_error


@needs_i16in
def test_a_rows_numbers_do_not_depend_on_its_batch_mates_or_place():
    packed = kernel_calls.i16in_pack_q4(gguf_q4_1(64, 96))
    assert_rows_independent(lambda x: kernel_calls.linear_q4_i16in(x, packed), torch.randn(20, 96))


@needs_i16in
def test_zero_tiny_and_non_finite_groups():
    w = gguf_q4_1(32, 64)
    x = torch.randn(6, 64)
    x[0] = 0  # no largest |x| to scale by: zeros, not a division by zero
    x[1, 5], x[2, 40], x[3, 33] = float("nan"), float("inf"), -float("inf")
    x[4, :32] = 0  # one zero group beside a live one
    x[5, :32] = 1e-36  # 32767 / 1e-36 is inf in fp32: quantized to zeros, not 0 * inf
    x[5, 3] = 0
    y = run(x, w)
    assert torch.equal(y[0], torch.zeros(32))
    # A non-finite input makes its whole row NaN (its group's scale is NaN), and no other row's.
    assert torch.isnan(y[1:4]).all() and torch.isfinite(y[torch.tensor([0, 4, 5])]).all()
    for row in (4, 5):
        torch.testing.assert_close(y[row].double(), F.linear(x[row:row + 1].double(), w.double())[0], rtol=1e-3,
                                   atol=1e-3)


@needs_i16in
def test_shapes_it_does_not_take_are_refused():
    w = gguf_q4_1(64, 96)
    with pytest.raises(ValueError, match="float32"):
        run(torch.randn(2, 64), w)
    qs = torch.zeros(2, 12, 2 * q4_kernel.BLOCK, dtype=torch.uint8)  # K = 48: not whole groups
    with pytest.raises(ValueError, match="refused"):
        kernel_calls.linear_q4_i16in(torch.randn(2, 48), (qs, torch.zeros(2, 2, 2, q4_kernel.BLOCK)))
    with pytest.raises(ValueError, match="pack_quads"):  # the fp32-input kernel's packing is not this one's
        kernel_calls.linear_q4_i16in(torch.randn(2, 96), kernel_calls.q4_pack(w))


@needs_i16in
@pytest.mark.skipif(bf16in_kernel.load() is None, reason="no AVX-512 BF16 here")
def test_under_q4_i16in_decode_rows_take_it_and_prompt_rows_are_the_bf16_prompt_kernels():
    w = gguf_q4_1(64, 96)
    ours, bf16in = prepare_one(w, "q4-i16in"), BF16InLinear(bf16in_kernel.pack(w))
    assert isinstance(ours, CodedLinear) and isinstance(ours.prefill, BF16InLinear) and ours.decode_inputs == "i16"
    x, b = torch.randn(9, 96), torch.randn(64)
    torch.testing.assert_close(ours(x, b, decode=True), run(x, w) + b, rtol=0, atol=0)
    assert torch.equal(ours(x, b, decode=False), bf16in(x, b, decode=False))
    assert choose("auto", torch.float32, one_layer_model(gguf_q4_1)) == "q4-i16in"


def test_without_vnni_auto_keeps_q4_and_asking_for_q4_i16in_is_an_error(monkeypatch):
    monkeypatch.setattr(i16in_kernel, "load", lambda: None)
    if q4_kernel.load() is not None:
        assert choose("auto", torch.float32, one_layer_model(gguf_q4_1)) == "q4"
    with pytest.raises(RuntimeError, match="q4-i16in: .*VNNI"):
        choose("q4-i16in", torch.float32, one_layer_model(gguf_q4_1))


def test_on_a_cpu_with_avx512_vnni_it_is_built():
    # Otherwise every needs_i16in test would skip, and the default fall back to fp32 decode inputs unseen.
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    if "avx512_vnni" not in flags or q4_kernel.load() is None:
        pytest.skip("no AVX-512 VNNI here, or no C build of the 4-bit kernels at all")
    assert i16in_kernel.load() is not None


# The lm_head's kernel over 8-bit grid weights (a GGUF Q8_0 tensor).

def test_an_8_bit_grid_is_found_exactly_and_anything_else_refused():
    w = gguf_q8_0(64, 96)
    q, d = i16in_kernel.q8_grid(w)
    assert q.dtype == torch.int8 and torch.equal((q.float() * d).reshape(w.shape), w)
    assert i16in_kernel.q8_grid(w + 1e-6 * torch.randn(w.shape)) is None  # off the grid
    assert i16in_kernel.q8_grid(gguf_q4_1(64, 96)) is None  # 4-bit with offsets: not w = q * d
    assert i16in_kernel.q8_grid(w[:48]) is None  # N not whole blocks of 32
    zero_group = w.clone()
    zero_group[3, 32:64] = 0
    assert i16in_kernel.q8_grid(zero_group) is not None


def q8_what_it_computes(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """linear_q8_i16in's answer in float64: x quantized per group as the C
    file does, times the exact weights."""
    groups = x.reshape(x.shape[0], -1, GROUP)
    amax = groups.abs().amax(-1, keepdim=True)
    i = torch.round(groups * (torch.full_like(amax, 32767) / amax)).clamp(-32767, 32767)
    return F.linear((i.double() * (amax / 32767).double()).reshape(x.shape), w.double())


@needs_i16in
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 16, 17])
def test_the_8_bit_kernel_quantizes_the_inputs_and_keeps_the_weights_exact(rows):
    w = gguf_q8_0(160, 192)
    x = torch.randn(rows, 192)
    x[:, 70] *= 40
    y = kernel_calls.linear_q8_i16in(x, i16in_kernel.pack_q8(w)).double()
    model, exact = q8_what_it_computes(x, w), F.linear(x.double(), w.double())
    torch.testing.assert_close(y, model, rtol=1e-5, atol=1e-4)
    assert (y - model).abs().max() * 5 < (model - exact).abs().max()
    # Nearer the exact lm_head than bf16w's rounded weights land.
    bf16w_error = (F.linear(x.double(), w.bfloat16().double()) - exact).norm()
    assert (y - exact).norm() * 5 < bf16w_error


@needs_i16in
def test_the_8_bit_kernels_rows_do_not_depend_on_their_batch_mates_and_non_finite_input_reaches_its_row():
    packed = i16in_kernel.pack_q8(gguf_q8_0(64, 96))
    run8 = lambda x: kernel_calls.linear_q8_i16in(x, packed)  # noqa: E731
    x = torch.randn(20, 96)
    assert_rows_independent(run8, x)
    x[1, 5], x[2, 40], x[3] = float("nan"), float("inf"), 0
    x[0, :32] = 1e-36  # a group below the quantization's range: zeros, the row's other groups as they are
    y = run8(x[:4])
    assert torch.isfinite(y[0]).all() and torch.isnan(y[1]).all() and torch.isnan(y[2]).all()
    assert torch.equal(y[3], torch.zeros(64))
    with pytest.raises(ValueError, match="float32"):
        run8(torch.randn(2, 64))


@needs_i16in
def test_under_q4_i16in_an_8_bit_lm_head_takes_it_and_any_other_bf16w():
    w = one_layer_model(gguf_q4_1)
    lm_head = gguf_q8_0(96, 64)
    assert choose_head("q4-i16in", lm_head) == "q8-i16in"
    assert choose_head("q4", lm_head) != "q8-i16in"  # only beside 16-bit-integer decode rows
    assert choose_head("q4-i16in", torch.randn(96, 64)) != "q8-i16in"  # not on the grid
    head = prepare(dataclasses.replace(w, lm_head=lm_head), "q4-i16in").lm_head
    assert isinstance(head, Q8I16InLinear)
    x = torch.randn(3, 64)
    assert torch.equal(head(x), kernel_calls.linear_q8_i16in(x, i16in_kernel.pack_q8(lm_head)))
    with pytest.raises(RuntimeError, match="q8-i16in"):
        choose_head("q4-i16in", torch.randn(96, 64), "q8-i16in")
