"""Each tensor group of a GGUF file on its own format's kernel
(bulkhead.model.format_linear, `gguf-i16in`): the 8-bit codes with a scale
per 16 (Q6_K, Q5_K, Q5_1, mixed fused layers), the 8-bit ones with a scale
per 32 (Q8_0, Q5_0) and the 4-bit ones, compared with the exact fp32 path;
a file whose groups differ in format (a Q4_K_M file) runs them side by side."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench import checkpoints
from bulkhead.model import decode_layers, format_linear, gguf_codes, gguf_import, gguf_kquants, i16in_kernel, \
    linear_kernel, weight_format
from bulkhead.model.gguf_codes import Q4Codes, Q8ACodes, Q8Codes
from tests.model.test_gguf_kquants import random_tensor
from tests.model.test_weight_format import SHAPES, assert_close_to_exact, build, build_exact
from tests.model import kernel_calls

gguf = pytest.importorskip("gguf")
needs_i16in = pytest.mark.skipif(i16in_kernel.load() is None, reason="no AVX-512 VNNI or no compiler here")
G = 32


def dyadic_codes(kind: str, n: int, k: int, seed: int = 0):
    """Codes of `kind` (KERNEL's keys: q5_0 and q5_1 as the decoders give them) whose scales are powers of two and
    offsets small multiples of one: every product and sum below stays exact in fp32."""
    gen = torch.Generator().manual_seed(seed)
    scale = lambda shape: 2.0 ** -torch.randint(2, 4, shape, generator=gen).float()  # noqa: E731
    offset = lambda shape: torch.randint(-4, 5, shape, generator=gen).float() / 8  # noqa: E731
    codes = lambda lo, hi: torch.randint(lo, hi, (n, k // G, G), generator=gen).to(torch.int8)  # noqa: E731
    if kind == "q4":
        return Q4Codes(codes(0, 16).to(torch.uint8), scale((n, k // G, 1)), offset((n, k // G, 1)))
    if kind in ("q8", "q5_0"):
        return Q8Codes(codes(-127, 128) if kind == "q8" else codes(-16, 16), scale((n, k // G, 1)))
    if kind == "q5_1":
        return Q8ACodes(codes(0, 32), scale((n, k // G, 1)).repeat_interleave(2, 1), offset((n, k // G, 1)))
    return Q8ACodes(codes(-32, 32), scale((n, k // 16, 1)), offset((n, k // G, 1)))


KERNEL = {"q4": "q4-i16in", "q5_0": "q8-i16in", "q5_1": "q8a-i16in", "q8": "q8-i16in", "q8a": "q8a-i16in"}


def exactly_quantized_inputs(rows: int, k: int, seed: int = 0) -> torch.Tensor:
    """Rows whose 16-bit quantization loses nothing: per group of 32 one
    input is 32767 * 2^-15 (the scale is then 2^-15), the others i * 2^-15, |i| <= 64."""
    gen = torch.Generator().manual_seed(seed)
    i = torch.randint(-64, 65, (rows, k // G, G), generator=gen).float()
    i[..., 5] = 32767 * torch.where(torch.rand(rows, k // G, generator=gen) < 0.5, -1.0, 1.0)
    return (i * 2.0 ** -15).reshape(rows, k)


def coded(codes) -> format_linear.CodedLinear:
    w = codes.values()
    format_linear.remember(w, codes)
    return format_linear.prepare_one(w), w


@needs_i16in
@pytest.mark.parametrize("kind", list(KERNEL))
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 16])
def test_where_the_inputs_quantize_exactly_each_kernel_is_the_exact_path_bit_for_bit(kind, rows):
    """Exact int32 sums and exact scales: with inputs the 16-bit quantization
    keeps and dyadic weights, nothing rounds, in the kernel or in fp32."""
    lin, w = coded(dyadic_codes(kind, 64, 64))
    assert lin.format == KERNEL[kind]
    x = exactly_quantized_inputs(rows, 64)
    exact = F.linear(x, w)
    assert torch.equal(exact.double(), F.linear(x.double(), w.double()))  # the fp32 answer is exact here ...
    assert torch.equal(lin(x, decode=True), exact)  # ... and so is the kernel's


@needs_i16in
@pytest.mark.parametrize("type_name, kernel", [("Q6_K", "q8a-i16in"), ("Q5_K", "q8a-i16in")])
def test_k_quant_codes_run_near_the_exact_path(type_name, kernel):
    """Random Q6_K and Q5_K blocks (moderate scales): the kernel's only error is
    each input within 2^-16 of its group's largest |x|."""
    raw = random_tensor(type_name, 64, 512, seed=1)
    raw[:, {"Q6_K": 208, "Q5_K": 0}[type_name]:][:, :2] = np.array([2 ** -10], np.float16).view(np.uint8)
    if type_name == "Q5_K":
        raw[:, 2:4] = np.array([2 ** -11], np.float16).view(np.uint8)
    found = gguf_codes.decode(raw, type_name, (64, 512))
    assert isinstance(found, Q8ACodes)
    lin, w = coded(found)
    assert lin.format == kernel
    x = torch.randn(5, 512)
    y, exact = lin(x, decode=True).double(), F.linear(x.double(), w.double())
    assert (y - exact).abs().max() < 2e-4 * exact.abs().max()
    assert (y - exact).norm() * 5 < (F.linear(x.bfloat16().double(), w.double()) - exact).norm()  # nearer than bf16


@needs_i16in
def test_the_4_and_8_bit_codes_run_their_own_kernels_through_the_dispatch():
    """linear_coded calls the format's kernel: the same numbers as calling it directly."""
    x = torch.randn(7, 128)
    q4 = dyadic_codes("q4", 64, 128, seed=2)
    lin, _ = coded(q4)
    assert torch.equal(lin(x, decode=True), kernel_calls.linear_q4_i16in(x, format_linear.pack(q4)))
    q8 = dyadic_codes("q8", 64, 128, seed=3)
    lin, _ = coded(q8)
    assert torch.equal(lin(x, decode=True), kernel_calls.linear_q8_i16in(x, format_linear.pack(q8)))


def test_every_codes_type_rewrites_into_the_scale_per_16_form_with_the_same_values():
    for codes in (dyadic_codes("q4", 32, 64), dyadic_codes("q8", 32, 64)):
        wide = gguf_codes.as_q8a(codes)
        assert torch.equal(wide.values().view(torch.int32), codes.values().view(torch.int32))


def test_q6_k_decodes_to_the_scale_per_16_codes_bit_for_bit():
    raw = random_tensor("Q6_K", 4, 512, seed=4)
    found = gguf_codes.decode(raw, "Q6_K", (4, 512))
    want = gguf_kquants.decode_q6_k(raw, (4, 512)).values()
    assert isinstance(found, Q8ACodes) and torch.equal(found.values().view(torch.int32), want.view(torch.int32))


# A Q4_K_M-like file: its groups in different formats, a fused qkv of two (Q4_0 q and k, Q8_0 v).
MIXED = {"attn_q": "Q4_0", "attn_k": "Q4_0", "attn_v": "Q8_0", "attn_output": "Q8_0", "ffn_gate": "Q4_1",
         "ffn_up": "Q4_1", "ffn_down": "Q5_0", "token_embd": "Q8_0"}


@pytest.fixture(scope="module")
def mixed_dir(tmp_path_factory):
    path = checkpoints.write_gguf(tmp_path_factory.mktemp("mixed") / "mixed.gguf", "Q4_0", types=MIXED, **SHAPES)
    return gguf_import.model_dir_for(path)


@needs_i16in
def test_a_file_of_mixed_formats_runs_each_group_on_its_own_kernel_near_the_exact_path(mixed_dir):
    assert weight_format.linear_format(mixed_dir) is None  # no one format: the model ran the exact path before
    fast = build(mixed_dir)
    assert (fast.linear_kernel, fast.lm_head_kernel) == ("gguf-i16in", "q8-i16in")
    layer = fast.engine.runner.model.weights.layers[0]
    assert {name: getattr(layer, name).format for name in ("qkv", "o", "gate_up", "down")} == \
        {"qkv": "q8a-i16in", "o": "q8-i16in", "gate_up": "q4-i16in", "down": "q8-i16in"}
    assert_close_to_exact(fast, build_exact(mixed_dir))


@needs_i16in
def test_the_c_decode_layers_take_a_model_of_mixed_formats(mixed_dir):
    fast = build(mixed_dir)
    model = fast.engine.runner.model
    assert decode_layers.DecodeLayers.why_not(model.config, model.weights, "c") is None
    assert model._c_layers is not None  # what the engine built: decode steps in one C call
    assert linear_kernel.choose("exact", torch.float32) in linear_kernel.EXACT_KERNELS


def test_a_file_of_mixed_formats_takes_gguf_i16in_only_where_every_groups_format_has_a_16_bit_input_row():
    from bulkhead.model import kernel_table

    every = frozenset(kernel_table.CPU_FEATURES)
    assert kernel_table.per_group({"Q4_K", "Q6_K", "Q5_0", "Q8_0"}, every)
    assert not kernel_table.per_group({"Q4_K", "F16"}, every)  # F16 has no such row: the exact path
    assert not kernel_table.per_group({"Q4_K", "Q6_K"}, frozenset({"avx512_bf16"}))  # no VNNI


def test_server_info_names_each_groups_own_kernel_not_gguf_i16in(mixed_dir):
    """/server_info's `weights` (weight_format.describe) under gguf-i16in: each
    group's own decode micro-kernel, by its stored types, layer by layer."""
    info = weight_format.describe(mixed_dir, "gguf-i16in", "q8-i16in")
    assert {group: info[group]["kernel"] for group in ("qkv", "o", "gate_up", "down")} == \
        {"qkv": "q8a-i16in", "o": "q8-i16in", "gate_up": "q4-i16in", "down": "q8-i16in"}  # as the layers hold them
    assert info["qkv"]["stored"] == "Q4_0+Q8_0" and info["lm_head"]["kernel"] == "q8-i16in"
    # A Q4_K_M file's down: Q4_K in some layers, Q6_K in others.
    formats = {"model.layers.0.mlp.down_proj.weight": "Q4_K", "model.layers.1.mlp.down_proj.weight": "Q6_K"}
    assert weight_format.per_group_kernels(formats, "down") == "q4-i16in+q8a-i16in"
    assert format_linear.kernel_of_types(["Q4_K", "Q4_K", "Q6_K"]) == "q8a-i16in"  # a fused mix: gguf_weights._fused
    assert format_linear.kernel_of_types(["Q4_K", "F16"]) is None
