"""The lm_head's bf16-weight kernel (bulkhead.model.head_kernel) and its selection.

Tolerance: the kernel sums x[k] * bf16(w[k]) in fp32, so against the same sum
in float64 it is off by fp32 rounding only (1e-5 relative to sum |x w|); against
the fp32 weight, each weight moves by at most 2^-9 of itself, so a logit moves
by at most 2^-9 * sum_k |x[k] w[k]| (plus that rounding).
"""

import pytest
import torch

from bulkhead.model import head_kernel, linear_kernel, q4_kernel
from bulkhead.model.linear_kernel import BF16WeightLinear, OneDNNLinear, choose_head, onednn_usable, prepare
from tests.model.grid_weights import gguf_q4_1

needs_q4 = pytest.mark.skipif(q4_kernel.load() is None or not onednn_usable(torch.float32),
                              reason="the 4-bit kernel or oneDNN cannot run here")

needs_kernel = pytest.mark.skipif(head_kernel.load() is None,
                                  reason="no C compiler, or torch does not run on libgomp here")


def _case(n=96, k=72, rows=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=gen), torch.randn(rows, k, generator=gen)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 7, 8, 9, 17])
def test_bf16w_computes_fp32_sums_of_bf16_weights(rows):
    w, x = _case(rows=rows)
    y = head_kernel.linear_bf16w(x, head_kernel.pack(w))
    assert y.dtype == torch.float32 and y.shape == (rows, w.shape[0])
    scale = (x.double().abs() @ w.double().abs().T)  # sum_k |x w| per output
    exact_bf16 = x.double() @ w.bfloat16().double().T
    assert ((y.double() - exact_bf16).abs() <= 1e-5 * scale + 1e-6).all()
    exact_fp32 = x.double() @ w.double().T
    assert ((y.double() - exact_fp32).abs() <= 2.0**-9 * scale * 1.01 + 1e-5 * scale).all()
    assert not torch.equal(y, torch.nn.functional.linear(x, w))  # the weights really were rounded


@needs_kernel
def test_a_rows_logits_do_not_depend_on_its_batch_mates_or_place():
    w, x = _case(n=128, k=64, rows=19, seed=1)
    packed = head_kernel.pack(w)
    full = head_kernel.linear_bf16w(x, packed)
    for m in range(1, 19):
        assert torch.equal(head_kernel.linear_bf16w(x[:m], packed), full[:m]), m
    assert torch.equal(head_kernel.linear_bf16w(x.roll(3, 0), packed), full.roll(3, 0))
    for i in range(19):
        assert torch.equal(head_kernel.linear_bf16w(x[i : i + 1], packed)[0], full[i])
    torch.set_num_threads(1)
    try:
        assert torch.equal(head_kernel.linear_bf16w(x, packed), full)  # threads split outputs, never a sum
    finally:
        torch.set_num_threads(2)


@needs_kernel
def test_non_finite_input_reaches_the_logits():
    w, x = _case()
    x[2, 5] = float("nan")
    y = head_kernel.linear_bf16w(x, head_kernel.pack(w))
    assert torch.isnan(y[2]).all() and torch.isfinite(y[[0, 1, 3, 4]]).all()


@needs_kernel
def test_shapes_it_cannot_take_are_refused():
    assert not head_kernel.fits(torch.zeros(40, 64))  # outputs not a multiple of the block
    w, x = _case()
    with pytest.raises(ValueError, match="float32"):
        head_kernel.linear_bf16w(x[:, :10], head_kernel.pack(w))


def _weights(n=96, k=64):
    from bulkhead.model.llama import LayerWeights, ModelWeights

    w, _ = _case(n=n, k=k)
    sq = gguf_q4_1(k, k)  # on a 4-bit grid, so that the layers can take q4
    layer = LayerWeights(torch.ones(k), sq, None, sq, torch.ones(k), gguf_q4_1(2 * k, k), sq)
    return ModelWeights(w, [layer], torch.ones(k), w)


@needs_kernel
@needs_q4
def test_reduced_precision_kernels_take_bf16w_and_the_exact_kernels_keep_fp32():
    w = _weights()
    assert choose_head("q4", w.lm_head) == "bf16w"
    assert choose_head("bf16", w.lm_head) == "bf16-in"  # a bf16 checkpoint's: the kernel table's bf16 row
    assert choose_head("onednn", w.lm_head) == choose_head("aten", w.lm_head) == "fp32"
    assert isinstance(prepare(w, "q4").lm_head, BF16WeightLinear)
    assert isinstance(prepare(w, "onednn").lm_head, OneDNNLinear)  # --linear-kernel onednn: the exact model
    assert isinstance(prepare(w, "q4", "fp32").lm_head, OneDNNLinear)
    assert isinstance(prepare(w, "onednn", "bf16w").lm_head, BF16WeightLinear)
    x = torch.randn(3, 64)
    torch.testing.assert_close(prepare(w, "q4").lm_head(x, decode=True),
                               head_kernel.linear_bf16w(x, head_kernel.pack(w.lm_head)), rtol=0, atol=0)


@needs_q4
def test_where_bf16w_cannot_run_the_lm_head_falls_back_to_fp32(monkeypatch):
    monkeypatch.setattr(head_kernel, "load", lambda: None)
    w = _weights()
    assert choose_head("q4", w.lm_head) == "fp32"
    assert isinstance(prepare(w, "q4").lm_head, OneDNNLinear)
    with pytest.raises(RuntimeError, match="bf16w"):
        choose_head("q4", w.lm_head, "bf16w")
    with pytest.raises(ValueError, match="lm_head kernel must be one of"):
        choose_head("q4", w.lm_head, "int8")


@needs_kernel
def test_a_vocabulary_the_kernel_does_not_take_keeps_fp32():
    w = _weights(n=100)  # not a multiple of 32 outputs
    assert choose_head("q4", w.lm_head) == "fp32"
    assert linear_kernel.HEAD_PRECISION["fp32"] == "lm_head fp32"
