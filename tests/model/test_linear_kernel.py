"""Choosing the linear kernel and laying weights out for it (bulkhead.model.linear_kernel)."""

import pytest
import torch

from bulkhead.model import linear_kernel
from bulkhead.model.linear_kernel import (INT4_GROUP, Int4Linear, OneDNNLinear, choose, int4_usable, onednn_usable,
                                          prepare_one)

needs_onednn = pytest.mark.skipif(not onednn_usable(torch.float32), reason="this torch build has no oneDNN linear")
needs_bf16 = pytest.mark.skipif(not onednn_usable(torch.bfloat16), reason="this torch build has no oneDNN bf16 linear")
needs_int4 = pytest.mark.skipif(not (int4_usable() and onednn_usable(torch.bfloat16)),
                                reason="this torch build has no CPU int4 kernel")


def test_auto_takes_onednn_where_the_build_runs_it_and_aten_is_always_honoured():
    assert choose("aten", torch.float32) == "aten"
    assert choose("auto", torch.float32) == ("onednn" if onednn_usable(torch.float32) else "aten")


def test_asking_for_onednn_where_it_cannot_run_is_an_error_not_a_fallback(monkeypatch):
    monkeypatch.setattr(linear_kernel, "onednn_usable", lambda dtype: False)
    assert choose("auto", torch.float32) == "aten"
    for kernel in ("onednn", "onednn-bf16", "int4"):
        with pytest.raises(RuntimeError, match="cannot run oneDNN"):
            choose(kernel, torch.float32)


def test_asking_for_int4_where_the_build_lacks_it_is_an_error(monkeypatch):
    monkeypatch.setattr(linear_kernel, "onednn_usable", lambda dtype: True)
    monkeypatch.setattr(linear_kernel, "int4_usable", lambda: False)
    with pytest.raises(RuntimeError, match="no CPU int4"):
        choose("int4", torch.float32)


def test_an_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="linear kernel must be one of"):
        choose("mkl", torch.float32)


def _case(out_features=48, in_features=64, rows=5):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(out_features, in_features, generator=gen)
    return w, torch.randn(out_features, generator=gen), torch.randn(rows, in_features, generator=gen)


@needs_onednn
def test_a_laid_out_fp32_weight_computes_the_same_linear_within_rounding():
    w, b, x = _case()
    layer = prepare_one(w, "onednn")
    assert isinstance(layer, OneDNNLinear) and layer.w.is_mkldnn
    torch.testing.assert_close(layer(x, b), torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)


@needs_bf16
def test_the_bf16_kernel_returns_fp32_within_bf16_rounding():
    w, b, x = _case()
    y = prepare_one(w, "onednn-bf16")(x, b)
    ref = torch.nn.functional.linear(x, w, b)
    assert y.dtype == torch.float32
    # bf16 keeps 8 bits of mantissa: inputs, weights and the output each round by <= 2^-9.
    assert (y - ref).abs().max() <= 0.02 * ref.abs().max()
    assert not torch.equal(y, ref)  # it really ran in bf16


@needs_int4
def test_int4_decode_rows_see_the_4_bit_weight_and_other_rows_the_bf16_one():
    w, b, x = _case()
    layer = prepare_one(w, "int4")
    assert isinstance(layer, Int4Linear)
    ref = torch.nn.functional.linear(x, w, b)
    decode, prefill = layer(x, b, decode=True), layer(x, b, decode=False)
    assert decode.dtype == prefill.dtype == torch.float32
    torch.testing.assert_close(prefill, layer.prefill(x, b))
    # 16 levels over each group's range: every weight within half a step.
    groups = w.reshape(w.shape[0], -1, INT4_GROUP)
    half_step = ((groups.amax(-1) - groups.amin(-1)) / 30).max()
    assert (decode - ref).abs().max() <= x.abs().sum(-1).max() * half_step * 1.1 + 0.02 * ref.abs().max()
    assert not torch.equal(decode, prefill)  # two kernels, two weights


@needs_int4
def test_a_weight_of_a_shape_the_int4_kernel_cannot_take_stays_bf16():
    w, _, _ = _case(out_features=40)  # N must be a multiple of 16
    assert not Int4Linear.fits(w)
    assert isinstance(prepare_one(w, "int4"), OneDNNLinear)


def _weights_of(make):
    from bulkhead.model.llama import LayerWeights, ModelWeights

    layer = LayerWeights(torch.ones(64), make(96, 64), None, make(64, 64), torch.ones(64), make(128, 64), make(64, 64))
    return ModelWeights(torch.zeros(10, 64), [layer], torch.ones(64), torch.zeros(10, 64))


def _on_grid(n, k, seed=0):
    """Dequantized 4-bit weights: per group of 32 inputs, min + q * step, q in 0..15, both ends used."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k // INT4_GROUP, INT4_GROUP), generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15
    lo, step = torch.randn(n, k // INT4_GROUP, 1, generator=gen), torch.rand(n, k // INT4_GROUP, 1, generator=gen)
    return (lo + q * step).reshape(n, k)


@needs_int4
def test_auto_takes_int4_only_for_weights_already_on_a_4_bit_grid():
    grid = _weights_of(_on_grid)
    assert linear_kernel.on_4bit_grid(grid)
    assert choose("auto", torch.float32, grid) == "int4"
    off_grid = _weights_of(lambda n, k: _on_grid(n, k) + 1e-3 * torch.randn(n, k))
    assert not linear_kernel.on_4bit_grid(off_grid)
    assert choose("auto", torch.float32, off_grid) == "onednn"
    assert choose("auto", torch.float32) == "onednn"  # no weights given: the exact kernel
    assert choose("onednn", torch.float32, grid) == "onednn"  # asked for by name: honoured
