"""GGUF blocks decoded as stored (bulkhead.model.gguf_codes, issue 35 item 1):
the codes the kernels pack are, bit for bit, what the grid search over the
dequantized values found before, and the values are gguf-py's dequantize."""


import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from bulkhead.model import gguf_codes, gguf_kquants, i16in_kernel, q4_kernel
from bulkhead.model.gguf_codes import Q4Codes, Q8Codes, Values
from tests.model import kernel_calls


def stored(type_name: str, rows: int = 64, cols: int = 256, seed: int = 0, scale: float = 0.05) -> np.ndarray:
    """Random weights quantized by gguf-py into `type_name`'s stored bytes ([rows, row bytes])."""
    w = (np.random.default_rng(seed).standard_normal((rows, cols)) * scale).astype(np.float32)
    w[3, :32] = 0.0  # a group of one value: scale 0
    w[5, 32:64] = np.abs(w[5, 32:64])  # a group on one side of zero
    return quants.quantize(w, GGMLQuantizationType[type_name])


def dequantized(raw: np.ndarray, type_name: str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(quants.dequantize(raw, GGMLQuantizationType[type_name])))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_4bit_blocks_pack_as_the_grid_search_packs_them(type_name, seed):
    raw = stored(type_name, seed=seed)
    found = gguf_codes.decode(raw, type_name, (64, 256))
    assert isinstance(found, Q4Codes)
    ref = dequantized(raw, type_name)
    assert torch.equal(found.values(), ref)  # equal values (-0.0 == 0.0: a Q4_0 zero under a negative scale)
    searched = kernel_calls.q4_pack(ref)
    assert searched is not None
    direct = q4_kernel.pack_grid(found.q, found.d, found.m)
    assert all(same_bits(a, b) for a, b in zip(direct, searched))


@pytest.mark.parametrize("seed", [0, 1])
def test_q8_0_blocks_pack_as_the_grid_search_packs_them(seed):
    raw = stored("Q8_0", seed=seed)
    found = gguf_codes.decode(raw, "Q8_0", (64, 256))
    assert isinstance(found, Q8Codes)
    ref = dequantized(raw, "Q8_0")
    assert same_bits(found.values(), ref)
    direct, searched = i16in_kernel.pack_q8_grid(found.q, found.d), i16in_kernel.pack_q8(ref)
    assert all(same_bits(a, b) for a, b in zip(direct, searched))


@pytest.mark.parametrize("type_name", ["F32", "F16", "BF16"])
def test_float_tensors_are_their_stored_values(type_name):
    raw = stored(type_name)
    found = gguf_codes.decode(raw, type_name, (64, 256))
    assert isinstance(found, Values) and found.w.dtype == torch.float32
    assert same_bits(found.values(), dequantized(raw, type_name).reshape(64, 256))
    if type_name == "BF16":  # still bf16 values, for the bf16 kernel
        assert torch.equal(found.w.bfloat16().float(), found.w)


def test_a_type_with_no_decoder_is_dequantized_by_gguf_py_and_named(caplog, monkeypatch):
    monkeypatch.delitem(gguf_kquants.DECODERS, "Q5_0")  # as if there were no Q5_0 decoder
    raw = stored("Q5_0")
    assert gguf_codes.fallback_types(["Q4_1", "Q5_0", "F32"]) == ["Q5_0"]
    found = gguf_codes.decode(raw, "Q5_0", (64, 256))
    assert isinstance(found, Values)
    assert same_bits(found.w, dequantized(raw, "Q5_0"))
    assert "no decoder for GGUF type Q5_0" in caplog.text


def test_a_q4_0_group_under_a_negative_scale_counts_up_from_its_smallest_value():
    """gguf-py's Q4_0 maps the largest |w| to q = 0 with d = max / -8: for a
    positive max d < 0 and the codes run downward; packed for the kernel, d >= 0."""
    w = np.linspace(-0.3, 0.8, 32, dtype=np.float32).reshape(1, 32).repeat(32, 0)
    raw = quants.quantize(w, GGMLQuantizationType.Q4_0)
    assert np.frombuffer(raw[0, :2].tobytes(), np.float16)[0] < 0
    found = gguf_codes.decode(raw, "Q4_0", (32, 32))
    assert bool((found.d > 0).all()) and int(found.q.min()) == 0
    assert torch.equal(found.m.reshape(-1), found.values().amin(-1))
    assert torch.equal(found.values(), dequantized(raw, "Q4_0"))


def test_where_the_search_finds_another_exact_grid_the_stored_codes_are_kept():
    """In the whole bundled file requantized to Q4_0, one group of 3.3M held
    three values that a scale 2/3 of the stored one also rebuilds exactly, and
    the search took that one; the stored codes rebuild the same weights."""
    w = np.zeros((32, 32), np.float32)
    w[:, 5], w[:, 9] = 2.015625, -0.50390625
    raw = quants.quantize(w, GGMLQuantizationType.Q4_0)
    found = gguf_codes.decode(raw, "Q4_0", (32, 32))
    q, d, m = q4_kernel.grid(dequantized(raw, "Q4_0"))
    assert int(found.q.max()) == 10 and int(q.max()) == 15  # the stored step, the searched one
    assert torch.equal(found.values(), (q.float() * d + m).reshape(32, 32))
