"""The 4-bit decode kernel with fp32 inputs and sums (bulkhead.model.q4_kernel)."""

import pytest
import torch
import torch.nn.functional as F

from bulkhead.model import bf16in_kernel, i16in_kernel, linear_kernel, q4_kernel
from bulkhead.model.linear_kernel import Q4Linear, choose, onednn_usable, prepare_one
from tests.model.grid_weights import gguf_q4_1, one_layer_model
from tests.model.row_checks import assert_rows_independent
from tests.model import kernel_calls

needs_q4 = pytest.mark.skipif(q4_kernel.load() is None or not onednn_usable(torch.float32),
                              reason="the 4-bit kernel cannot be built here (no compiler or no libgomp torch)")


def test_a_q4_1_weight_is_rebuilt_bit_for_bit():
    w = gguf_q4_1(64, 96)
    q, d, m = q4_kernel.grid(w)
    assert q.dtype == torch.uint8 and int(q.max()) <= 15
    assert torch.equal((q.float() * d + m).reshape(w.shape), w)


def test_groups_of_different_scale_kinds_in_one_weight_are_each_rebuilt():
    # Most groups take an fp16 scale (GGUF's), one takes an fp32 one (a
    # mantissa of 16 bits: q * d stays exact in fp32): the scales are tried in
    # turn, each on the groups no earlier one rebuilt (it once raised here).
    w = gguf_q4_1(64, 96)
    q = torch.randint(0, 16, (32,)).float()
    q[0], q[1] = 0, 15
    w[5, 32:64] = q * (0.125 * (1 + 2 ** -15)) - 0.25
    q_, d, m = q4_kernel.grid(w)
    assert torch.equal((q_.float() * d + m).reshape(w.shape), w)
    assert float(d[5, 1]) == 0.125 * (1 + 2 ** -15) != float(d[5, 1].half())


def test_weights_it_cannot_rebuild_exactly_are_refused():
    w = gguf_q4_1(64, 96)
    assert q4_kernel.grid(w + 1e-4 * torch.randn(w.shape)) is None  # off the grid
    assert q4_kernel.grid(torch.randn(64, 96)) is None
    # On a grid, but of an fp32 scale whose products q * d round: fma(q, d, m)
    # would then differ from q * d + m, so the kernel would not be the model.
    q = torch.randint(0, 16, (64, 3, 32)).float()
    q[..., 0], q[..., 1] = 0, 15
    assert q4_kernel.grid((q * 0.1234567 + 0.5).reshape(64, 96)) is None
    assert q4_kernel.grid(gguf_q4_1(40, 96)) is None  # N not a multiple of the block
    assert q4_kernel.grid(gguf_q4_1(64, 96).double()) is None


@needs_q4
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 16, 17])
def test_it_computes_the_fp32_linear_of_the_weight(rows):
    w = gguf_q4_1(96, 128)
    x = torch.randn(rows, 128)
    y = kernel_calls.linear_q4(x, kernel_calls.q4_pack(w))
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-5)  # fp32 sums, another order


@needs_q4
def test_a_rows_numbers_do_not_depend_on_its_batch_mates_or_place():
    packed = kernel_calls.q4_pack(gguf_q4_1(64, 96))
    assert_rows_independent(lambda x: kernel_calls.linear_q4(x, packed), torch.randn(16, 96), shift=3)


@needs_q4
def test_non_finite_input_reaches_the_output():
    w = gguf_q4_1(32, 64)
    x = torch.zeros(2, 64)
    x[1, 5] = float("nan")
    y = kernel_calls.linear_q4(x, kernel_calls.q4_pack(w))
    assert torch.isfinite(y[0]).all() and torch.isnan(y[1]).all()


@needs_q4
def test_decode_rows_take_the_4_bit_kernel_and_prompt_rows_onednn():
    w = gguf_q4_1(64, 96)
    layer = prepare_one(w, "q4")
    assert isinstance(layer, Q4Linear)
    x, b = torch.randn(5, 96), torch.randn(64)
    torch.testing.assert_close(layer(x, b, decode=True), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer(x, b, decode=False), layer.prefill(x, b))
    with pytest.raises(ValueError, match="not exactly on a 4-bit grid"):
        prepare_one(torch.randn(64, 96), "q4")


# What auto takes for a 4-bit grid model: prompts through bf16 inputs and
# decode rows through 16-bit integer inputs where this CPU has AVX-512 BF16
# and VNNI; else q4 (fp32 prompts and decode rows).
AUTO_Q4 = "q4-i16in" if i16in_kernel.load() is not None and bf16in_kernel.load() is not None else "q4"


@needs_q4
def test_auto_takes_q4_only_for_weights_exactly_on_a_4_bit_grid():
    assert choose("auto", torch.float32, one_layer_model(gguf_q4_1)) == AUTO_Q4
    off = one_layer_model(lambda n, k: gguf_q4_1(n, k) + 1e-3 * torch.randn(n, k))
    assert choose("auto", torch.float32, off) not in ("q4", "q4-i16in")
    with pytest.raises(RuntimeError, match="not exactly on a 4-bit grid"):
        choose("q4", torch.float32, off)
    assert choose("onednn", torch.float32, one_layer_model(gguf_q4_1)) == "onednn"  # asked for by name: honoured


def test_where_the_kernel_cannot_be_built_auto_does_not_take_it(monkeypatch):
    monkeypatch.setattr(q4_kernel, "load", lambda: None)
    assert choose("auto", torch.float32, one_layer_model(gguf_q4_1)) not in ("q4", "q4-i16in")
