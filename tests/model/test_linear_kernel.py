"""Choosing the linear kernel (bulkhead.model.linear_kernel)."""

import pytest
import torch

from bulkhead.model import linear_kernel
from bulkhead.model.linear_kernel import choose, lay_out, linear, onednn_usable


def test_auto_takes_onednn_where_the_build_runs_it_and_aten_is_always_honoured():
    assert choose("aten", torch.float32) == "aten"
    assert choose("auto", torch.float32) == ("onednn" if onednn_usable(torch.float32) else "aten")


def test_asking_for_onednn_where_it_cannot_run_is_an_error_not_a_fallback(monkeypatch):
    monkeypatch.setattr(linear_kernel, "onednn_usable", lambda dtype: False)
    assert choose("auto", torch.float32) == "aten"
    with pytest.raises(RuntimeError, match="cannot run oneDNN"):
        choose("onednn", torch.float32)


def test_an_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="linear kernel must be one of"):
        choose("mkl", torch.float32)


@pytest.mark.skipif(not onednn_usable(torch.float32), reason="this torch build has no oneDNN linear")
def test_a_laid_out_weight_computes_the_same_linear_within_rounding():
    gen = torch.Generator().manual_seed(0)
    w, b, x = torch.randn(48, 32, generator=gen), torch.randn(48, generator=gen), torch.randn(5, 32, generator=gen)
    laid_out = lay_out(w)
    assert laid_out.is_mkldnn and not w.is_mkldnn
    torch.testing.assert_close(linear(x, laid_out, b), torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
