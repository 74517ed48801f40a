"""The `q8-i16in` lm_head over a Q8_0 file's own fp16 scales
(head_linear.pack_q8_0, csrc/linear_q8a.h's linear_q8_0_i16in): 1.0625
bytes a weight where fp32 scales took 1.125, the very bits of the fp32-scale
kernel (an fp16 widens to fp32 exactly), every row alone."""

import pytest
import torch

from bulkhead.model import head_linear, i16in_kernel, q4_kernel
from bulkhead.model.head_linear import Q8I16InLinear
from tests.model.grid_weights import gguf_q8_0
from tests.model.row_checks import assert_rows_independent
from tests.model import kernel_calls

needs_i16in = pytest.mark.skipif(i16in_kernel.load() is None, reason="no AVX-512 VNNI here")


def test_the_lm_head_holds_the_files_fp16_scales_one_and_one_sixteenth_bytes_a_weight():
    w = gguf_q8_0(96, 64)
    qb, d = head_linear.pack_q8_0(w)
    assert qb.dtype == torch.int8 and d.dtype == torch.float16
    assert (qb.nbytes + d.nbytes) / w.numel() == 1 + 2 / q4_kernel.GROUP
    assert torch.equal(d.float(), i16in_kernel.pack_q8(w)[1])  # the same scales, widened exactly


@needs_i16in
def test_fp16_scales_give_the_fp32_scale_kernels_bits_row_by_row():
    w = gguf_q8_0(96, 128, seed=4)
    head = Q8I16InLinear.of(w)
    x = torch.randn(13, 128)
    x[11, 5], x[12, 9] = float("nan"), float("inf")
    y = head(x)
    assert torch.equal(y[:11], kernel_calls.linear_q8_i16in(x, i16in_kernel.pack_q8(w))[:11])
    assert torch.isnan(y[11]).all() and torch.isnan(y[12]).all()  # a non-finite input reaches its row alone
    assert_rows_independent(head, x[:11])


@needs_i16in
def test_the_c_decode_steps_tail_runs_the_fp16_scale_kernel():
    fn, qb, d = Q8I16InLinear.of(gguf_q8_0(64, 64)).tail_kernel()
    assert d.dtype == torch.float16
    assert fn is i16in_kernel.load().linear_q8_0_i16in


def test_a_scale_off_fp16_precision_is_refused_not_rounded(monkeypatch):
    w = gguf_q8_0(64, 64)
    q, d = i16in_kernel.q8_grid(w)
    monkeypatch.setitem(i16in_kernel._Q8_GRIDS, w, (q, d * (1 + 2 ** -20)))  # an fp32 scale fp16 cannot hold
    with pytest.raises(ValueError, match="fp16 precision"):
        head_linear.pack_q8_0(w)


def test_a_cached_packing_with_fp32_scales_is_refused():
    qb, d = head_linear.pack_q8_0(gguf_q8_0(64, 64))
    assert Q8I16InLinear((qb, d)).packed[1] is d
    with pytest.raises(ValueError, match="fp16 scales"):
        Q8I16InLinear((qb, d.float()))
