"""Choosing the linear kernel by the kernel table and laying weights out for
it (bulkhead.model.linear_kernel, bulkhead.model.kernel_table)."""

import pytest
import torch

from bulkhead.model import bf16in_kernel, i16in_kernel, kernel_table, linear_kernel, q4_kernel
from bulkhead.model.linear_kernel import OneDNNLinear, choose, onednn_usable, prepare_one
from tests.model.grid_weights import gguf_q4_1, one_layer_model

needs_onednn = pytest.mark.skipif(not onednn_usable(torch.float32), reason="this torch build has no oneDNN linear")
needs_q4 = pytest.mark.skipif(q4_kernel.load() is None or not onednn_usable(torch.float32),
                              reason="the 4-bit kernel or oneDNN cannot run here")


def test_auto_takes_onednn_where_the_build_runs_it_and_aten_is_always_honoured():
    assert choose("aten", torch.float32) == "aten"
    assert choose("auto", torch.float32) == ("onednn" if onednn_usable(torch.float32) else "aten")
    assert choose("exact", torch.float32) == choose("auto", torch.float32)


def test_asking_for_onednn_where_it_cannot_run_is_an_error_not_a_fallback(monkeypatch):
    monkeypatch.setattr(linear_kernel, "onednn_usable", lambda dtype: False)
    assert choose("auto", torch.float32) == choose("exact", torch.float32) == "aten"
    with pytest.raises(RuntimeError, match="cannot run oneDNN"):
        choose("onednn", torch.float32)


def test_an_unknown_or_retired_kernel_is_refused():
    for kernel in ("mkl", "int4", "q4-bf16in-all", "q4-bf16-prefill", "onednn-bf16", "q4-bf16in"):
        with pytest.raises(ValueError, match="linear kernel must be one of"):
            choose(kernel, torch.float32)


@needs_onednn
def test_a_laid_out_fp32_weight_computes_the_same_linear_within_rounding():
    gen = torch.Generator().manual_seed(0)
    w, b, x = torch.randn(48, 64, generator=gen), torch.randn(48, generator=gen), torch.randn(5, 64, generator=gen)
    layer = prepare_one(w, "onednn")
    assert isinstance(layer, OneDNNLinear) and layer.w.is_mkldnn
    torch.testing.assert_close(layer(x, b), torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)


def test_every_format_ends_on_the_exact_path_and_every_row_names_a_known_kernel():
    from bulkhead.model.kernel_names import HEAD_KERNELS, KERNELS

    for fmt in ("Q4_0", "Q4_1", "Q4_K", "Q6_K", "Q8_0", "BF16", "F16", "F32"):
        rows = kernel_table.rows_for(fmt, frozenset(kernel_table.CPU_FEATURES))
        assert rows[-1] is kernel_table.EXACT
    for row in (*kernel_table.TABLE, kernel_table.EXACT):
        assert row.linear in KERNELS and row.lm_head in HEAD_KERNELS


def test_a_cpu_without_the_features_skips_their_rows():
    assert [r.linear for r in kernel_table.rows_for("Q4_1", frozenset())] == ["q4", "onednn"]
    assert [r.linear for r in kernel_table.rows_for("Q4_1", frozenset({"avx512_bf16"}))] == ["q4", "onednn"]
    assert [r.linear for r in kernel_table.rows_for("BF16", frozenset())] == ["onednn"]


def test_cpu_features_come_from_proc_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_vnni\n")
    assert kernel_table.cpu_features(str(info)) == {"avx2", "avx512f", "avx512_vnni"}
    assert kernel_table.cpu_features(str(tmp_path / "missing")) == frozenset()


@needs_q4
def test_auto_follows_the_table_for_4_bit_grid_weights(monkeypatch):
    grid = one_layer_model(gguf_q4_1)
    expected = "q4-i16in" if i16in_kernel.load() and bf16in_kernel.load() else "q4"
    assert choose("auto", torch.float32, grid) == expected
    assert choose("auto", torch.float32, grid, "Q4_0") == expected
    monkeypatch.setattr(kernel_table, "cpu_features", lambda: frozenset())  # a CPU without AVX-512
    assert choose("auto", torch.float32, grid) == "q4"
    off_grid = one_layer_model(lambda n, k: gguf_q4_1(n, k) + 1e-3 * torch.randn(n, k))
    assert choose("auto", torch.float32, off_grid) == "onednn"  # near a grid is not on it: the exact path
    assert choose("onednn", torch.float32, grid) == "onednn"  # asked for by name: honoured


@needs_q4
def test_a_row_whose_kernel_does_not_build_falls_to_the_next(monkeypatch):
    grid = one_layer_model(gguf_q4_1)
    monkeypatch.setattr(kernel_table, "cpu_features", lambda: frozenset(kernel_table.CPU_FEATURES))
    monkeypatch.setattr(i16in_kernel, "load", lambda: None)
    assert choose("auto", torch.float32, grid) == "q4"
    with pytest.raises(RuntimeError, match="q4-i16in: this CPU has no AVX-512 BF16 or no AVX-512 VNNI"):
        choose("q4-i16in", torch.float32, grid)
