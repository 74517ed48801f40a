"""GGUF K-quant blocks decoded as stored (bulkhead.model.gguf_kquants):
the codes and scales rebuild gguf-py's dequantize bit for bit in the
kernels' arithmetic."""

from pathlib import Path

import numpy as np
import pytest
import torch

from bulkhead.model import gguf_kquants, i16in_kernel, q4_kernel
from bulkhead.model.gguf_codes import Q4Codes, Q8ACodes, Q8Codes
from bulkhead.model.gguf_kquants import BLOCKS, DECODERS, KQuantShapeError
from tests.model import kernel_calls

gguf = pytest.importorskip("gguf")

# Where each type keeps its fp16 scales inside a super-block (byte offsets).
HALF_FIELDS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q5_0": (0,), "Q5_1": (0, 2)}


def fp16_scales(rng: np.random.Generator, n: int) -> np.ndarray:
    """n finite fp16 values of either sign over fp16's whole range, zeros,
    subnormals and the largest value among them."""
    values = np.sign(rng.standard_normal(n)) * 10.0 ** rng.uniform(-7.5, 4.5, n)
    special = np.array([0.0, -0.0, 2.0 ** -24, -(2.0 ** -20), 65504.0, 1.0])
    values[: len(special)] = special[: n]
    return values.astype(np.float16)


def random_tensor(type_name: str, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """[rows, bytes per row] uint8 of random blocks: every code and 6-bit
    or int8 scale byte random, every fp16 field a valid finite value."""
    rng = np.random.default_rng(seed)
    inputs, size = BLOCKS[type_name]
    blocks = rows * k // inputs
    raw = rng.integers(0, 256, (blocks, size), dtype=np.uint8)
    for at in HALF_FIELDS[type_name]:
        raw[:, at:at + 2] = fp16_scales(rng, blocks).view(np.uint8).reshape(blocks, 2)
    return raw.reshape(rows, -1)


def gguf_values(raw: np.ndarray, type_name: str) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).copy())


def assert_bitwise(a: torch.Tensor, b: torch.Tensor):
    assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))  # -0 and +0 told apart


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K", "Q5_0", "Q5_1"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_blocks_rebuild_gguf_pys_dequantize_bit_for_bit(type_name, seed):
    raw = random_tensor(type_name, 8, 1024, seed)
    found = DECODERS[type_name](raw, (8, 1024))
    assert_bitwise(found.values(), gguf_values(raw, type_name))


# Tensors quantized and dequantized by llama.cpp itself (the fixture's make_fixture.c says how).
GGML_FIXTURE = Path(__file__).parents[1] / "fixtures" / "gguf_kquants" / "kquants_ggml.npz"


@pytest.mark.parametrize("type_name", ["Q4_K", "Q5_K", "Q6_K"])
def test_llama_cpps_own_k_quant_tensors_decode_to_its_own_dequantized_values(type_name):
    with np.load(GGML_FIXTURE) as fixture:
        raw, ggml_values = fixture[f"{type_name}_bytes"], fixture[f"{type_name}_ggml_values"]
    found = DECODERS[type_name](raw, ggml_values.shape)
    assert_bitwise(found.values(), torch.from_numpy(ggml_values))
    assert_bitwise(found.values(), gguf_values(raw, type_name))


@pytest.mark.parametrize("type_name", ["Q5_0", "Q5_1"])
def test_gguf_pys_q5_0_and_q5_1_quantizers_output_decodes_to_its_values(type_name):
    # gguf-py's Q5_0/Q5_1 quantizers match ggml's reference ones bit for bit (as its code says).
    w = np.random.default_rng(1).standard_t(5, (8, 576)).astype(np.float32) * 0.02
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType[type_name])
    found = DECODERS[type_name](raw, w.shape)
    assert_bitwise(found.values(), gguf_values(raw, type_name))
    assert float((found.values() - torch.from_numpy(w)).abs().max()) < 0.02  # and they are w, quantized


def test_q5_0_is_the_8_bit_kernels_grid():
    found = gguf_kquants.decode_q5_0(random_tensor("Q5_0", 4, 64), (4, 64))
    assert isinstance(found, Q8Codes) and found.q.dtype == torch.int8 and found.q.shape == (4, 2, 32)
    assert int(found.q.min()) == -16 and int(found.q.max()) == 15
    assert torch.equal(found.d.half().float(), found.d)  # fp16 precision: q * d is one exact product


def assert_products_exact(q: torch.Tensor, d: torch.Tensor):
    """Every q * d exact in fp32: fma(q, d, m) then rounds once, as gguf-py's q * d - dm."""
    assert torch.equal((q.float() * d).double(), q.double() * d.double())


def test_q4_k_is_q4_kernels_grid_with_fp32_scales():
    raw = random_tensor("Q4_K", 4, 512)
    found = gguf_kquants.decode_q4_k(raw, (4, 512))
    assert isinstance(found, Q4Codes)
    assert found.q.dtype == torch.uint8 and found.q.shape == (4, 16, q4_kernel.GROUP) and int(found.q.max()) <= 15
    assert found.d.dtype == found.m.dtype == torch.float32 and found.d.shape == found.m.shape == (4, 16, 1)
    assert_products_exact(found.q, found.d)
    # d * sc is not an fp16 value in general: an fp16 scale would round it.
    assert bool((found.d.half().float() != found.d).any())


def test_q5_k_codes_take_five_bits_and_their_products_are_exact():
    found = gguf_kquants.decode_q5_k(random_tensor("Q5_K", 4, 512), (4, 512))
    assert isinstance(found, Q8ACodes) and found.q.shape == (4, 16, 32)
    assert int(found.q.max()) == 31 and int(found.q.min()) == 0
    assert_products_exact(found.q.reshape(4, -1, 16), found.d)


def test_q6_k_codes_are_six_bit_signed_per_group_of_16_and_exact():
    found = gguf_kquants.decode_q6_k(random_tensor("Q6_K", 4, 512), (4, 512))
    assert isinstance(found, Q8ACodes) and found.q.dtype == torch.int8 and found.q.shape == (4, 16, 32)
    assert found.d.shape == (4, 32, 1)  # a scale per 16 inputs
    assert int(found.q.min()) == -32 and int(found.q.max()) == 31
    assert_products_exact(found.q.reshape(4, -1, 16), found.d)


def test_a_hand_built_q4_k_block_puts_each_scale_and_code_where_ggml_does():
    # Sub-block j: scale 7 (j + 1), min 2 j + 33 (from j = 4 on, both take
    # bits 4-5 from the top of bytes 0-7), codes all j + 8 (high nibbles for odd j).
    sc, mn = 7 * np.arange(1, 9), 2 * np.arange(8) + 33
    packed = np.zeros(12, np.uint8)
    packed[0:4] = (sc[:4] & 63) | ((sc[4:] >> 4) << 6)
    packed[4:8] = (mn[:4] & 63) | ((mn[4:] >> 4) << 6)
    packed[8:12] = (sc[4:] & 15) | ((mn[4:] & 15) << 4)
    codes = np.arange(8) + 8
    qs = np.concatenate([np.full(32, codes[2 * i] | (codes[2 * i + 1] << 4), np.uint8) for i in range(4)])
    halves = np.array([0.5, 0.25], np.float16).view(np.uint8)
    block = np.concatenate([halves, packed, qs]).reshape(1, 144)
    w = gguf_kquants.decode_q4_k(block).values().reshape(8, 32)
    expected = 0.5 * sc * codes - 0.25 * mn
    assert torch.equal(w, torch.from_numpy(np.repeat(expected[:, None], 32, 1)).float())


def test_q8_k_is_ggmls_d_times_q_and_a_q8_grid_only_with_fp16_precision_scales():
    rng = np.random.default_rng(0)
    q = rng.integers(-128, 128, (2, 256), dtype=np.int8)
    d = np.array([0.5, 0.1], np.float32)  # 0.1 has 24 significant bits
    sums = q.reshape(2, 16, 16).sum(-1, dtype=np.int16)
    raw = np.concatenate([d.view(np.uint8).reshape(2, 4), q.view(np.uint8), sums.view(np.uint8)], 1)
    found = gguf_kquants.decode_q8_k(raw.reshape(1, -1), (1, 512))
    assert not isinstance(found, Q8Codes)  # its codes reach -128: the fp32 values
    assert_bitwise(found.values(), torch.from_numpy((q * d[:, None]).reshape(1, 512)))
    assert isinstance(gguf_kquants.decode_q8_k(raw[:1], (1, 256)), Q8Codes)


def test_bytes_that_are_not_whole_super_blocks_of_the_shape_are_refused():
    raw = random_tensor("Q4_K", 2, 512)
    with pytest.raises(KQuantShapeError, match="512 inputs .* 200 bytes for 1 rows"):
        gguf_kquants.decode_q4_k(raw.reshape(-1)[:200], (1, 512))
    with pytest.raises(KQuantShapeError, match="a row of 500 inputs"):
        gguf_kquants.decode_q4_k(raw, (2, 500))
    with pytest.raises(KQuantShapeError, match="uint8"):
        gguf_kquants.decode_q6_k(np.zeros((2, 105), np.uint16))
    assert gguf_kquants.decode_q4_k(raw).values().shape == (2, 512)  # the reader's [rows, bytes] alone


needs_q4 = pytest.mark.skipif(q4_kernel.load() is None, reason="the 4-bit kernel cannot be built here")


@needs_q4
def test_the_4_bit_kernel_runs_q4_k_codes_as_they_are(monkeypatch):
    raw = random_tensor("Q4_K", 64, 256, seed=3)
    raw[:, 0:4] = np.array([2 ** -8, 2 ** -9], np.float16).view(np.uint8)  # moderate d, dmin: a small atol
    found = gguf_kquants.decode_q4_k(raw, (64, 256))
    w = found.values()
    monkeypatch.setitem(q4_kernel._GRIDS, w, (found.q, found.d, found.m))  # what gguf-direct's remember_grid does
    x = torch.randn(3, 256)
    y = kernel_calls.linear_q4(x, kernel_calls.q4_pack(w))
    torch.testing.assert_close(y, x @ w.T, rtol=1e-5, atol=1e-4)  # fp32 sums in another order


needs_i16in = pytest.mark.skipif(i16in_kernel.load() is None, reason="no AVX-512 VNNI or no compiler here")


@needs_i16in
def test_the_8_bit_kernel_runs_q5_0_codes_as_they_are(monkeypatch):
    w = np.random.default_rng(2).standard_t(5, (64, 576)).astype(np.float32) * 0.02
    found = gguf_kquants.decode_q5_0(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q5_0), w.shape)
    w = found.values()
    monkeypatch.setitem(i16in_kernel._Q8_GRIDS, w, (found.q, found.d))  # what gguf-direct's remember_q8_grid does
    x = torch.randn(3, 576)
    y = kernel_calls.linear_q8_i16in(x, i16in_kernel.pack_q8(w))
    # Its inputs are rounded to 16 bits per group of 32 (tests/model/test_i16in_kernel.py bounds that).
    torch.testing.assert_close(y.double(), x.double() @ w.double().T, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("type_name, kind", [("Q4_K", "Q4Codes"), ("Q5_K", "Q8ACodes"), ("Q6_K", "Q8ACodes")])
def test_the_gguf_reader_takes_k_quants_to_the_kernel_family_they_fit(type_name, kind):
    """gguf_codes.decode, what serving a .gguf file calls: Q4_K's codes go to the 4-bit
    kernels as they are, Q5_K's and Q6_K's to the 8-bit codes with a scale per 16."""
    from bulkhead.model import gguf_codes

    with np.load(GGML_FIXTURE) as fixture:
        raw, ggml_values = fixture[f"{type_name}_bytes"], fixture[f"{type_name}_ggml_values"]
    found = gguf_codes.decode(raw, type_name, ggml_values.shape)
    assert type(found).__name__ == kind
    assert_bitwise(found.values().reshape(ggml_values.shape), torch.from_numpy(ggml_values))
