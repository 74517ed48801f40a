"""The 4-bit decode kernel over the file's own scales (bulkhead.model.q4_scales):
a Q4_0 weight is held in the file's 18 bytes per 32 weights and a Q4_1 one
in its 20 (not 24: fp32 scale and offset), the weights it rebuilds are the
file's exactly, and its outputs stay within the input quantization's own
bound of the exact fp32 answer (Q4_1: the same bits as over fp32 scales)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, quants

from bulkhead.model import gguf_codes, i16in_kernel, q4_kernel, q4_scales
from bulkhead.model.format_linear import CodedLinear
from bulkhead.model.linear_kernel import prepare_one
from tests.model import kernel_calls

needs_i16in = pytest.mark.skipif(i16in_kernel.load() is None, reason="no AVX-512 VNNI here, or no C build")
N, K = 96, 256


def stored_codes(type_name: str, seed: int = 0):
    """gguf-py's quantization of random weights, decoded as bulkhead reads a file: (codes, exact fp32 values)."""
    w = (np.random.default_rng(seed).standard_normal((N, K)) * 0.05).astype(np.float32)
    w[3, :32] = 0.0  # a group of zeros: scale 0
    w[5, 32:64] = np.abs(w[5, 32:64])  # all on one side of zero: Q4_0's scale is negative
    raw = quants.quantize(w, GGMLQuantizationType[type_name])
    codes = gguf_codes.decode(raw, type_name, (N, K))
    ref = torch.from_numpy(np.ascontiguousarray(quants.dequantize(raw, GGMLQuantizationType[type_name])))
    return codes, ref.reshape(N, K)


@pytest.mark.parametrize("type_name, layout, nbytes", [("Q4_0", "q4_0", 18), ("Q4_1", "q4_1", 20)])
def test_a_file_weight_is_held_in_the_files_own_bytes(type_name, layout, nbytes):
    codes, _ = stored_codes(type_name)
    packed = q4_scales.pack(codes.q, codes.d, codes.m)
    assert q4_scales.layout_of(packed) == layout
    assert kernel_calls.bytes_per_weight(packed) == nbytes / 32  # the fp32 scale and offset held 24


def test_scales_wider_than_fp16_keep_fp32():
    codes, _ = stored_codes("Q4_1")
    d = codes.d * (1 + 2 ** -20)  # off fp16's grid (as a Q4_K scale may be)
    packed = q4_scales.pack(codes.q, d, codes.m)
    assert q4_scales.layout_of(packed) == "f32" and kernel_calls.bytes_per_weight(packed) == 24 / 32


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_q4_0_codes_are_the_files_own_form_exactly(seed):
    codes, ref = stored_codes("Q4_0", seed)
    q, d = q4_scales.as_q4_0(codes.q, codes.d, codes.m)
    assert int(q.max()) <= 15 and bool((d < 0).any())  # some groups keep the quantizer's negative scale
    assert torch.equal(((q.float() - 8) * d).reshape(N, K), ref)  # -0.0 == 0.0: equal values


def test_a_grid_not_of_q4_0s_form_is_not_taken_for_one():
    codes, _ = stored_codes("Q4_1")  # offsets that are no integer multiple of the scale
    assert q4_scales.as_q4_0(codes.q, codes.d, codes.m) is None


def quantization_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """|y - x @ w.T| allowed a kernel whose only rounding of note is each
    input to a 16-bit integer step of its group (s_g = max |x| / 32767, so
    within s_g / 2), plus fp32 rounding of the group sums."""
    groups = x.double().reshape(x.shape[0], -1, 32)
    step = groups.abs().amax(-1) / 32767  # [M, K/32]
    per_group = w.double().abs().reshape(w.shape[0], -1, 32).sum(-1)  # [N, K/32]
    return step @ per_group.T / 2 + 1e-6 * (x.double().abs() @ w.double().abs().T)


@needs_i16in
@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize("rows", [1, 3, 5, 9])
def test_outputs_stay_within_the_input_rounding_of_the_exact_answer(type_name, rows):
    codes, ref = stored_codes(type_name)
    packed = q4_scales.pack(codes.q, codes.d, codes.m)
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(rows))
    x[:, 7] *= 40  # an outlier: its group's step is 40 times the others'
    y = kernel_calls.linear_q4_i16in(x, packed)
    error = (y.double() - F.linear(x.double(), ref.double())).abs()
    assert bool((error <= quantization_bound(x, ref)).all())
    if type_name == "Q4_1":  # the file's fp16 d and m are the fp32 layout's numbers: the same bits
        dm = q4_kernel.pack_grid(codes.q, codes.d, codes.m)[1]
        assert torch.equal(y, kernel_calls.linear_q4_i16in(x, (packed[0], dm)))


@needs_i16in
def test_q4_0_offset_is_taken_off_in_integers_not_as_a_cancelling_float_sum():
    """w = d (q - 8): fp32 s * T * d and -8 d * S nearly cancel, and their
    rounding lands in the answer; the kernel subtracts 8 * sum(i) in int32."""
    codes, ref = stored_codes("Q4_0")
    x = torch.randn(16, K, generator=torch.Generator().manual_seed(3))
    exact = F.linear(x.double(), ref.double())
    centred = kernel_calls.linear_q4_i16in(x, q4_scales.pack(codes.q, codes.d, codes.m))
    affine = kernel_calls.linear_q4_i16in(x, (q4_scales.pack_quads(codes.q),
                                               q4_kernel.pack_grid(codes.q, codes.d, codes.m)[1]))
    assert (centred.double() - exact).norm() < (affine.double() - exact).norm()


@needs_i16in
def test_q4_i16in_layers_hold_the_files_bytes_and_run_through_the_descriptor():
    codes, ref = stored_codes("Q4_0")
    q4_kernel.remember_grid(ref, (codes.q, codes.d, codes.m))
    layer = prepare_one(ref, "q4-i16in", runs="decode")
    assert isinstance(layer, CodedLinear) and q4_scales.layout_of(layer.weights) == "q4_0"
    assert sum(t.nbytes for t in layer.weights) == N * K * 18 // 32
    x = torch.randn(2, K)
    assert torch.equal(layer(x, decode=True), kernel_calls.linear_q4_i16in(x, layer.weights))


@needs_i16in
def test_the_c_decode_layers_read_each_layers_own_layout(smollm2_dir):
    """The bundled Q4_1 model with layer 0 held in fp32 scales (the same
    numbers, 24 bytes a group): the C layers, which call one function for
    every layer, give the very logits of the model held all in fp16 scales."""
    import dataclasses

    from bulkhead.model import decode_layers
    from bulkhead.model.llama import LlamaModel
    from bulkhead.model.loader import load_model
    from tests.model.test_decode_layers import decode, prefilled

    if decode_layers.load() is None:
        pytest.skip("the C decode layers cannot be built here")
    model = load_model(smollm2_dir, linear_kernel="q4-i16in", decode_attention="c", decode_glue="c")
    layer = model.weights.layers[0]
    assert q4_scales.layout_of(layer.qkv.weights) == "q4_1"
    wide = {name: CodedLinear.from_packed("q4-i16in", (lin.weights[0], lin.weights[1].float()), lin.prefill)
            for name in ("qkv", "o", "gate_up", "down") for lin in [getattr(layer, name)]}
    layers = [dataclasses.replace(layer, **wide), *model.weights.layers[1:]]
    mixed = LlamaModel(model.config, dataclasses.replace(model.weights, layers=layers), "c", "c")
    assert mixed.decode_glue == "c"
    runner, works = prefilled(model)
    before = runner.pool.data.clone()
    ours = decode(runner, works)
    runner.pool.data.copy_(before)
    runner.model = mixed
    assert torch.equal(decode(runner, works), ours)
