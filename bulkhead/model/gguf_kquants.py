"""GGUF K-quant tensors (Q4_K, Q5_K, Q6_K, Q8_K, and the Q5_0 and Q5_1 a
Q4_K_M file holds) decoded as they are stored: the integer codes and the
per-group scales, multiplied out once into an fp32 scale (and offset) per
sub-block, as bulkhead.model.gguf_codes' types, never through fp32 values
and a search for their grid.

A K-quant row is cut into super-blocks of 256 inputs, each with one or two
fp16 scales and, per sub-block, small integer multipliers of them
(llama.cpp's ggml-quants.c, block_q4_K and the rest):

| type | bytes / 256 | form (per sub-block of G inputs) | decoded as |
|---|---|---|---|
| Q4_K | 144 | w = q * d + m, q 0..15, G 32 | Q4Codes (the 4-bit kernels) |
| Q5_K | 176 | w = q * d + m, q 0..31, G 32 | Q8ACodes |
| Q6_K | 210 | w = q * d, q -32..31, G 16 | Q8ACodes |
| Q8_K | 292 | w = q * d, q int8, G 32 (d per 256) | Q8Codes if d has fp16 precision, else Q8ACodes |
| Q5_0 | 22 / 32 | w = q * d, q -16..15, G 32, d fp16 | Q8Codes |
| Q5_1 | 24 / 32 | w = q * d + m, q 0..31, G 32, d and m fp16 | Q8ACodes |

Q5_0 and Q5_1 are no K-quants, but where a row is not whole super-blocks
(SmolLM2-135M's 576 inputs) llama-quantize writes Q5_0 for Q4_K, Q5_1 for
Q5_K and Q8_0 for Q6_K (llama-quant.cpp's tensor_type_fallback).

Why it is exact: d and dmin are fp16 (11 significant bits), the
multipliers 6-bit unsigned (Q4_K, Q5_K) or int8 (Q6_K), so d * sc has at
most 18 significant bits and q * (d * sc) at most 23: every product is
exact in fp32, and w = q * d + m rounds once, where the kernel's
fma(q, d, m) and gguf-py's `d * q - dm` both round it. `values()` is
therefore gguf-py's dequantize bit for bit (tests/model/test_gguf_kquants.py).
d * sc is not an fp16 value in general (17-18 bits), so the scales stay
fp32. A scale may be negative (llama.cpp's Q6_K and Q5_0 quantizers write
either sign); the kernels' arithmetic does not depend on it.

Each decoder takes the tensor's stored bytes ([rows, bytes per row] uint8,
as gguf-py's GGUFReader maps them) and optionally the logical shape
[rows, K] to check them against.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from bulkhead.model.gguf_codes import Q4Codes, Q8ACodes, Q8Codes, Values, no_offset

QK_K = 256  # inputs per super-block, every K-quant
# type -> (inputs, bytes) per block, as gguf.GGML_QUANT_SIZES says
BLOCKS = {"Q4_K": (QK_K, 144), "Q5_K": (QK_K, 176), "Q6_K": (QK_K, 210), "Q8_K": (QK_K, 292),
          "Q5_0": (32, 22), "Q5_1": (32, 24)}


class KQuantShapeError(ValueError):
    """The bytes given are not whole blocks of the shape given."""


def _super_blocks(raw: np.ndarray, type_name: str, shape: tuple[int, ...] | None) -> torch.Tensor:
    """raw as [rows, blocks per row, block bytes] uint8 (a copy: the reader's map is read-only)."""
    inputs, size = BLOCKS[type_name]
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise KQuantShapeError(f"{type_name}: stored bytes must be uint8, got {raw.dtype}")
    if shape is not None:
        rows, k = int(np.prod(shape[:-1], dtype=np.int64)), int(shape[-1])
    else:
        rows = raw.shape[0] if raw.ndim == 2 else 1
        k = (raw.size // max(rows, 1)) // size * inputs
    if k % inputs or raw.size != rows * (k // inputs) * size:
        raise KQuantShapeError(f"{type_name}: a row of {k} inputs must be whole blocks of {inputs} "
                               f"({size} bytes each), got {raw.size} bytes for {rows} rows")
    return torch.from_numpy(raw.reshape(rows, k // inputs, size).copy())


def _half(field: torch.Tensor) -> torch.Tensor:
    """Two bytes per super-block (little-endian fp16) as float32 [rows, blocks, 1]."""
    return field.contiguous().view(torch.float16).float()


def _scales_and_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes as 8 six-bit scales and 8 six-bit mins, each
    [rows, blocks, 8] uint8 (ggml's get_scale_min_k4): bytes 0-3 hold
    scales 0-3 and, in their top bits, the top bits of scales 4-7; bytes 4-7
    the same for the mins; bytes 8-11 the low nibbles of scales 4-7 (low)
    and mins 4-7 (high)."""
    sc_lo, mn_lo, both = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = torch.cat([sc_lo & 63, (both & 15) | ((sc_lo >> 2) & 48)], -1)
    mn = torch.cat([mn_lo & 63, (both >> 4) | ((mn_lo >> 2) & 48)], -1)
    return sc, mn


def _nibbles_by_32(qs: torch.Tensor) -> torch.Tensor:
    """Q4_K/Q5_K's 128 bytes of nibbles as 8 sub-blocks of 32 [rows, blocks, 8, 32]:
    each 32 bytes give two sub-blocks, their low nibbles then their high ones."""
    chunks = qs.reshape(*qs.shape[:-1], 4, 1, 32)
    return torch.cat([chunks & 15, chunks >> 4], -2).reshape(*qs.shape[:-1], 8, 32)


def _affine(b: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's (q [rows, K/32, 32], d, m [rows, K/32, 1]) of super-blocks b [rows, blocks, bytes]
    with codes q [rows, blocks, 8, 32]."""
    rows = b.shape[0]
    d, dmin = _half(b[..., 0:2]), _half(b[..., 2:4])
    sc, mn = _scales_and_mins(b[..., 4:16])
    scale = d * sc.float()  # fp16 times 6 bits: exact
    offset = -(dmin * mn.float())  # exact; w = q * scale - dmin * mn == fma(q, scale, offset)
    return q.reshape(rows, -1, 32).contiguous(), scale.reshape(rows, -1, 1), offset.reshape(rows, -1, 1)


def _wide(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> Q8ACodes:
    """5-bit codes (0..31) with a scale and offset per 32 as Q8ACodes: each scale twice."""
    return Q8ACodes(q.to(torch.int8), d.repeat_interleave(2, 1), m)


def decode_q4_k(raw: np.ndarray, shape: tuple[int, ...] | None = None) -> Q4Codes:
    """Q4_K super-block (144 bytes): d fp16, dmin fp16, 12 bytes of 6-bit
    scales and mins, 128 bytes of nibbles; sub-block j of 32 inputs holds
    w = (d * sc_j) * q - dmin * min_j, q in 0..15: the 4-bit grid with
    that sub-block's scale and offset."""
    b = _super_blocks(raw, "Q4_K", shape)
    return Q4Codes(*_affine(b, _nibbles_by_32(b[..., 16:144])))


def decode_q5_k(raw: np.ndarray, shape: tuple[int, ...] | None = None) -> Q8ACodes:
    """Q5_K super-block (176 bytes): as Q4_K, then 32 bytes whose bit j is
    sub-block j's fifth bit (of the input at that byte's index), then the
    128 bytes of nibbles; q in 0..31."""
    b = _super_blocks(raw, "Q5_K", shape)
    low = _nibbles_by_32(b[..., 48:176])
    bit = torch.arange(8, dtype=torch.uint8).reshape(8, 1)
    high = (b[..., 16:48].unsqueeze(-2) >> bit) & 1  # [rows, blocks, 8, 32]
    return _wide(*_affine(b, low | (high << 4)))


def decode_q6_k(raw: np.ndarray, shape: tuple[int, ...] | None = None) -> Q8ACodes:
    """Q6_K super-block (210 bytes): 128 bytes of low nibbles, 64 bytes of
    2-bit highs, 16 int8 scales, d fp16; input i holds
    w = (d * sc[i // 16]) * (q_i - 32). Per half of 128 inputs (64 + 32
    bytes), input l + 32 t (t in 0..3, l in 0..31) is nibble t // 2 of
    low byte l + 32 (t % 2) and bits 2t..2t+1 of high byte l."""
    b = _super_blocks(raw, "Q6_K", shape)
    rows, blocks = b.shape[:2]
    low = b[..., 0:128].reshape(rows, blocks, 2, 1, 64)
    low = torch.cat([low & 15, low >> 4], -2).reshape(rows, blocks, 2, 4, 32)
    shift = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(4, 1)
    high = (b[..., 128:192].reshape(rows, blocks, 2, 1, 32) >> shift) & 3  # [rows, blocks, 2, 4, 32]
    q = ((low | (high << 4)).view(torch.int8) - 32).reshape(rows, -1, 32)
    sc = b[..., 192:208].contiguous().view(torch.int8).float()
    scale = _half(b[..., 208:210]) * sc  # fp16 times int8: exact
    return Q8ACodes(q, scale.reshape(rows, -1, 1), no_offset((rows, q.shape[1], 1)))


def decode_q8_k(raw: np.ndarray, shape: tuple[int, ...] | None = None) -> Q8Codes | Q8ACodes | Values:
    """Q8_K super-block (292 bytes): d fp32, 256 int8 codes, 16 int16 sums
    (for ggml's dot products; not needed). w = d * q. llama.cpp uses it
    for activations and writes no file of it; decoded for completeness.
    Its d is fp32, so q * d is one rounding (ggml's dequantize_row_q8_K
    rounds the same): Q8Codes, which hold w as q * d exactly, only where d
    has fp16 precision."""
    b = _super_blocks(raw, "Q8_K", shape)
    rows = b.shape[0]
    d = b[..., 0:4].contiguous().view(torch.float32)  # [rows, blocks, 1]
    q = b[..., 4:260].contiguous().view(torch.int8).reshape(rows, -1, 32)
    scale = d.repeat_interleave(QK_K // 32, 1).reshape(rows, -1, 1)
    if bool((scale.half().float() == scale).all()):
        return Q8Codes(q, scale)
    if q.numel() and int(q.to(torch.int16).abs().amax()) > 127:  # -128: no Q8ACodes code
        return Values((q.float() * scale).reshape(rows, -1))
    return Q8ACodes(q, scale.repeat_interleave(2, 1), no_offset(scale.shape))


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1's 4 bytes (a little-endian uint32) as 32 bits [rows, blocks, 32]: bit e is input e's."""
    bit = torch.arange(8, dtype=torch.uint8)
    return ((qh.unsqueeze(-1) >> bit) & 1).reshape(*qh.shape[:-1], 32)


def decode_q5_0(raw: np.ndarray, shape: tuple[int, ...] | None = None) -> Q8Codes:
    """Q5_0 block (22 bytes): d fp16, 4 bytes of fifth bits, 16 bytes of
    nibbles (input j low, j + 16 high); w = d * (q - 16). d keeps its sign
    (the quantizer writes either; the 8-bit kernel's arithmetic has no use for it)."""
    b = _super_blocks(raw, "Q5_0", shape)
    low = torch.cat([b[..., 6:22] & 15, b[..., 6:22] >> 4], -1)
    q = (low | (_fifth_bits(b[..., 2:6]) << 4)).view(torch.int8) - 16
    return Q8Codes(q, _half(b[..., 0:2]))


def decode_q5_1(raw: np.ndarray, shape: tuple[int, ...] | None = None) -> Q8ACodes:
    """Q5_1 block (24 bytes): d fp16, m fp16, 4 bytes of fifth bits, 16
    bytes of nibbles; w = d * q + m, q in 0..31 (d * q exact in fp32)."""
    b = _super_blocks(raw, "Q5_1", shape)
    low = torch.cat([b[..., 8:24] & 15, b[..., 8:24] >> 4], -1)
    q = low | (_fifth_bits(b[..., 4:8]) << 4)
    return _wide(q, _half(b[..., 0:2]), _half(b[..., 2:4]))


# GGUF tensor type name -> decoder; bulkhead.model.gguf_codes.decoder reads it beside its own.
DECODERS: dict[str, Callable[..., Q4Codes | Q8Codes | Q8ACodes | Values]] = {
    "Q4_K": decode_q4_k,
    "Q5_K": decode_q5_k,
    "Q6_K": decode_q6_k,
    "Q8_K": decode_q8_k,
    "Q5_0": decode_q5_0,
    "Q5_1": decode_q5_1,
}
