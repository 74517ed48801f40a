"""GGUF tensors decoded as they are stored: the codes and scales of each
block, not fp32 values to search for a grid in.

One table, DECODERS, maps a GGUF tensor type to its decoder; a decoder
takes the tensor's stored bytes ([rows, bytes per row], uint8, as gguf-py's
GGUFReader maps them) and returns one of:

| result | what it holds | which kernels take it |
|---|---|---|
| `Q4Codes(q, d, m)` | w = q * d + m per group of 32 inputs, q in 0..15, d >= 0 (q4_kernel.grid's convention) | the 4-bit kernels (q4_kernel.pack_grid) |
| `Q8Codes(q, d)` | w = q * d per group of 32, q int8, d of fp16 precision (i16in_kernel.q8_grid's) | the 8-bit lm_head (q8-i16in) |
| `Q8ACodes(q, d, m)` | w = q * d + m, q int8, d per 16 inputs, m per 32 (Q6_K, Q5_K, Q5_1; a fused layer of mixed formats) | the 8-bit-codes kernel with a scale per 16 (q8a-i16in: format_linear) |
| `Values(w)` | the stored values in fp32 (F32, F16 and BF16 are exact in fp32) | the float kernels |

Every result's `values()` is the tensor in fp32, bit for bit what gguf-py's
dequantize gives (tests/model/test_gguf_codes.py): the exact path
(`--linear-kernel onednn`/`aten`) and the bf16 prompt kernels read those.

K-quants (and Q5_0, Q5_1): bulkhead.model.gguf_kquants' DECODERS, into the
same types. A type with no decoder falls back to gguf-py's dequantize to
fp32 (`Values`, logged; `fallback_types` names them for /server_info).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import numpy as np
import torch

log = logging.getLogger(__name__)

GROUP = 32  # inputs per block of Q4_0, Q4_1 and Q8_0 (and per scale of q4_kernel / i16in_kernel)


@dataclasses.dataclass(frozen=True)
class Q4Codes:
    q: torch.Tensor  # [N, K/32, 32] uint8 in 0..15
    d: torch.Tensor  # [N, K/32, 1] float32, >= 0 (fp16 for Q4_0/Q4_1; up to 17 bits for Q4_K): q * d exact in fp32
    m: torch.Tensor  # [N, K/32, 1] float32: the value q = 0 stands for

    def values(self) -> torch.Tensor:
        # q * d is exact (4 bits times an fp16 scale), so this is one rounding, as the kernel's fma.
        return _scaled(self.q, self.d, self.m)


@dataclasses.dataclass(frozen=True)
class Q8Codes:
    q: torch.Tensor  # [N, K/32, 32] int8
    d: torch.Tensor  # [N, K/32, 1] float32 of fp16 precision

    def values(self) -> torch.Tensor:
        return _scaled(self.q, self.d)


@dataclasses.dataclass(frozen=True)
class Q8ACodes:
    """The widest home of GGUF codes (csrc/linear_q8a.h): every type above
    and every K-quant rewrites into it exactly (`as_q8a`), so a fused
    layer whose parts are stored in different formats keeps its codes."""

    q: torch.Tensor  # [N, K/32, 32] int8 (Q6_K -32..31, Q5 0..31, Q4 0..15, Q8 -127..127)
    d: torch.Tensor  # [N, K/16, 1] float32: q * d exact in fp32 (an fp16 scale times <= 7 bits)
    m: torch.Tensor  # [N, K/32, 1] float32: the value q = 0 stands for (0 for the scaled types)

    def values(self) -> torch.Tensor:
        n = self.q.shape[0]
        w = (self.q.reshape(n, -1, 16).float() * self.d).reshape(self.q.shape)
        return (w + self.m).reshape(n, -1)  # q * d exact: one rounding, as fma(q, d, m)


def no_offset(shape) -> torch.Tensor:
    """The offset of a type without one: -0.0, as w + -0.0 is w bit for bit (a -0 value included, which
    + 0.0 would make +0) and the kernel's m * S adds a zero."""
    return torch.full(shape, -0.0)


def as_q8a(codes) -> Q8ACodes:
    """Q4Codes, Q8Codes or Q8ACodes as Q8ACodes: the same numbers (values() equal), each per-32 scale twice."""
    if isinstance(codes, Q8ACodes):
        return codes
    d = codes.d.repeat_interleave(2, 1)
    m = codes.m if isinstance(codes, Q4Codes) else no_offset(codes.d.shape)
    return Q8ACodes(codes.q.to(torch.int8), d, m)


@dataclasses.dataclass(frozen=True)
class Values:
    w: torch.Tensor  # [N, K] (or [K] for a norm) float32

    def values(self) -> torch.Tensor:
        return self.w


Decoded = Q4Codes | Q8Codes | Q8ACodes | Values


def _scaled(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
    """q * d (+ m) per group as fp32 [N, K], in numpy: two passes, no fp32 copy of q
    (half the time of torch's broadcast addcmul over groups of 32, measured)."""
    out = np.empty(q.shape, np.float32)
    np.multiply(q.numpy(), d.numpy(), out=out)
    if m is not None:
        np.add(out, m.numpy(), out=out)
    return torch.from_numpy(out.reshape(q.shape[0], -1))


def _blocks(raw: np.ndarray, block_bytes: int) -> np.ndarray:
    """The stored bytes [rows, row bytes] as [rows, blocks, block_bytes] uint8 (a view: nothing is read yet)."""
    raw = np.asarray(raw, dtype=np.uint8)
    return raw.reshape(raw.shape[0], -1, block_bytes)


def _half(field: np.ndarray) -> torch.Tensor:
    """Two bytes per block (little-endian fp16, as GGUF stores a scale) as float32 [rows, blocks, 1]."""
    return torch.from_numpy(np.ascontiguousarray(field).view(np.float16).astype(np.float32))


def _nibbles(qs: np.ndarray) -> torch.Tensor:
    """16 bytes per block as 32 codes: element j is byte j's low nibble, element j + 16 its high one.
    (numpy, straight from the mapping: 3x torch's cat of two strided halves, measured.)"""
    out = np.empty(qs.shape[:-1] + (2, qs.shape[-1]), np.uint8)
    np.bitwise_and(qs, 0x0F, out=out[..., 0, :])
    np.right_shift(qs, 4, out=out[..., 1, :])
    return torch.from_numpy(out.reshape(*qs.shape[:-1], 2 * qs.shape[-1]))


def _zero_where_constant(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """q with 0 in every group of scale 0 (a pass over q only where there is such a group)."""
    return q.masked_fill_(d == 0, 0) if bool((d == 0).any()) else q


def decode_q4_1(raw: np.ndarray) -> Q4Codes:
    """Q4_1 block (20 bytes): d fp16, m fp16, 16 bytes of nibbles; w = q * d + m, d >= 0 as its
    quantizer writes it. A group of one value (d = 0) keeps q = 0, as q4_kernel.grid writes it."""
    b = _blocks(raw, 20)
    d, m, q = _half(b[..., 0:2]), _half(b[..., 2:4]), _nibbles(b[..., 4:])
    if bool((d < 0).any()):
        raise ValueError("a Q4_1 block has a negative scale: not a Q4_1 quantizer's output")
    return Q4Codes(_zero_where_constant(q, d), d, m)


def decode_q4_0(raw: np.ndarray) -> Q4Codes:
    """Q4_0 block (18 bytes): d fp16 (of either sign), 16 bytes of nibbles; w = d * (q - 8).
    Rewritten as q4_kernel.grid finds it: step |d|, codes counted up from the group's
    smallest value (a negative d reverses them: d * (q - 8) = |d| * ((15 - q) - 7)), m that
    value. Every product here is a small integer times an fp16 scale, exact in fp32."""
    b = _blocks(raw, 18)
    d, q = _half(b[..., 0:2]), _nibbles(b[..., 2:])
    flip = d < 0
    code = torch.where(flip, 15 - q, q)
    low = code.amin(-1, keepdim=True)
    step = d.abs()
    # The group's smallest value, as dequantizing gives it (signed zero included: d * 0 is -0 for d < 0).
    m = d * torch.where(flip, 7 - low.float(), low.float() - 8)
    return Q4Codes(_zero_where_constant(code.sub_(low), step), step, m)


def decode_q8_0(raw: np.ndarray) -> Q8Codes:
    """Q8_0 block (34 bytes): d fp16, 32 int8 codes; w = q * d. As i16in_kernel.q8_grid finds
    it: d >= 0 (its quantizer writes max |w| / 127), a group of zeros with q = 0 and d = +0."""
    b = _blocks(raw, 34)
    d, q = _half(b[..., 0:2]), torch.from_numpy(np.ascontiguousarray(b[..., 2:]).view(np.int8))
    if bool((d < 0).any()):
        raise ValueError("a Q8_0 block has a negative scale: not a Q8_0 quantizer's output")
    return Q8Codes(_zero_where_constant(q, d), d.abs())


def _as_values(dtype: np.dtype) -> Callable[[np.ndarray], Values]:
    def decode(raw: np.ndarray) -> Values:
        return Values(torch.from_numpy(np.asarray(raw).view(dtype).astype(np.float32)))

    return decode


def decode_bf16(raw: np.ndarray) -> Values:
    """bf16 is fp32's upper half: the values exactly, still bf16 values (the bf16 kernel takes them)."""
    bits = torch.from_numpy(np.asarray(raw).view(np.uint16).astype(np.int32))
    return Values((bits << 16).view(torch.float32))


# GGUF tensor type name -> decoder. Names, not gguf's enum, so this table imports nothing of gguf.
DECODERS: dict[str, Callable[[np.ndarray], Decoded]] = {
    "Q4_0": decode_q4_0,
    "Q4_1": decode_q4_1,
    "Q8_0": decode_q8_0,
    "F32": _as_values(np.float32),
    "F16": _as_values(np.float16),  # to fp32, exact; bf16 only under a quality gate (not built)
    "BF16": decode_bf16,
}


def decoder(type_name: str) -> Callable[[np.ndarray], Decoded] | None:
    """The decoder of a GGUF tensor type ("Q4_1", "Q4_K", ...), or None (gguf-py's dequantize then)."""
    from bulkhead.model.gguf_kquants import DECODERS as KQUANTS  # built on this module's types

    return DECODERS.get(type_name) or KQUANTS.get(type_name)


def fallback_types(type_names) -> list[str]:
    """Those of `type_names` with no decoder: their tensors are dequantized to fp32 by gguf-py."""
    return sorted({t for t in type_names if decoder(t) is None})


def decode(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> Decoded:
    """The tensor of GGUF type `type_name` and logical `shape` ([rows, cols]
    as gguf-py's reader gives it), from its stored bytes `raw`."""
    fn = decoder(type_name)
    if fn is None:
        import gguf

        log.warning("no decoder for GGUF type %s: its tensors are dequantized to fp32 (gguf-py) and run the "
                    "float kernels", type_name)
        w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name])
        return Values(torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)).reshape(shape))
    found = fn(raw)
    if isinstance(found, Values):
        return Values(found.w.reshape(shape))
    return found
