"""The 4-bit codes' scales in the fewest bytes that hold them exactly, for
the decode kernel with 16-bit integer inputs (csrc/linear_i16in.h).

Why: a one-row decode step reads every weight once, so its time is the
bytes it reads. The fp32 kernel's packing (q4_kernel.pack_grid) holds per group of
32 inputs an fp32 scale d and an fp32 offset m: 0.75 bytes a weight, where
a Q4_0 file holds 0.5625 (an fp16 d; the offset is -8 d) and a Q4_1 file
0.625 (fp16 d and m). Holding the file's own fp16 numbers loses nothing:
widened to fp32 in the kernel they are the same d and m, and the kernel's
arithmetic is the same fused multiply-adds.

| layout | scales held | when | bytes a weight | C entry point (linear_coded tag) |
|---|---|---|---|---|
| q4_0 | fp16 d, signed, [N/NB, K/G, NB]; m = -8 d | every group is d * (q - 8) with d of fp16 | 0.5625 | linear_q4_0_i16in (4) |
| q4_1 | fp16 d and m, [N/NB, K/G, 2, NB] | d and m are fp16 values (a Q4_1 file) | 0.625 | linear_q4_1_i16in (3) |
| f32 | fp32 d and m, [N/NB, K/G, 2, NB] | otherwise (Q4_K's scales have up to 17 bits) | 0.75 | linear_q4_i16in (0) |

A Q4_0 file's codes arrive as the grid search finds them (gguf_codes:
d >= 0, q counted up from the group's smallest value, m that value);
`as_q4_0` turns them back into the file's form, d * (q - 8), by the
group's integer m / d, and packs the codes as they then stand.
"""

from __future__ import annotations

import torch

from bulkhead.model import q4_kernel

# layout -> (the C entry point, csrc/linear.c's CODED_* tag for linear_coded)
LAYOUTS = {"f32": ("linear_q4_i16in", 0), "q4_1": ("linear_q4_1_i16in", 3), "q4_0": ("linear_q4_0_i16in", 4)}


def as_q4_0(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(q [N, K/G, G] uint8 in 0..15, d [N, K/G, 1] fp32 of fp16 precision,
    of either sign) with d * (q - 8) the weights that q * d + m rebuild, or
    None where some group has no such form. w = d (q + c) for the group's
    integer c = m / d: with d > 0 the code is q + c + 8, with d < 0 it is
    8 - c - q (a Q4_0 quantizer's negative scale); a group of d = 0 holds
    zeros only where m is zero."""
    if not torch.equal(d.half().float(), d):
        return None
    zero = d == 0
    c = torch.where(zero, torch.zeros_like(m), m / torch.where(zero, torch.ones_like(d), d))
    if not bool((zero & (m != 0)).logical_not().all()) or not bool((c == c.round()).all()) \
            or not bool(((c * d == m) | zero).all()) or not bool(((c >= -8) & (c <= 7)).all()):
        return None
    lo, hi = q.amin(-1, keepdim=True).float(), q.amax(-1, keepdim=True).float()
    up = (hi + c + 8 <= 15) & (lo + c + 8 >= 0)  # d > 0: codes q + c + 8
    down = (8 - c - hi >= 0) & (8 - c - lo <= 15)  # d < 0: codes 8 - c - q
    if not bool((up | down | zero).all()):
        return None
    up = up | zero  # a zero group keeps its codes (0) and d = 0
    shift_up = torch.where(up, c + 8, torch.zeros_like(c)).to(torch.uint8)
    shift_down = torch.where(up, torch.zeros_like(c), 8 - c).to(torch.uint8)
    # uint8 arithmetic: each group's branch stays in 0..15 (checked above); the other branch's wrap is discarded.
    codes = torch.where(up, q + shift_up, shift_down - q)
    return codes, torch.where(up, d, -d)


# Within 4 inputs of a 32-bit lane, the input each byte's two nibbles hold (csrc/linear_i16in.h's layout).
_QUAD_ORDER = torch.tensor([0, 2, 1, 3])


def pack_quads(q: torch.Tensor) -> torch.Tensor:
    """q [N, K/G, G] in 0..15 as the kernel reads it: uint8 [N/NB, K/4, 64],
    for block b and inputs 4u..4u+3, byte 4j + e holding output j's q of
    input 4u + (0, 2, 1, 3)[e] in its low nibble and output j + NB/2's in
    its high one."""
    n, k = q.shape[0], q.shape[1] * q.shape[2]
    nb = q4_kernel.BLOCK
    q = q.reshape(n // nb, 2, nb // 2, k // 4, 4).index_select(-1, _QUAD_ORDER)  # [blocks, half, j, u, e]
    return (q[:, 0] | (q[:, 1] << 4)).permute(0, 2, 1, 3).reshape(n // nb, k // 4, 2 * nb).contiguous()


def pack(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """grid()'s (q [N, K/G, G], d and m [N, K/G, 1]) as (pack_quads' codes,
    the scales in the smallest layout of the table at the top that holds
    them exactly)."""
    n, groups = q.shape[:2]
    nb = q4_kernel.BLOCK
    symmetric = as_q4_0(q, d, m)
    if symmetric is not None:
        codes, signed = symmetric
        return pack_quads(codes), signed.reshape(n // nb, nb, groups).transpose(1, 2).half().contiguous()
    dm = torch.stack([d.reshape(n // nb, nb, groups), m.reshape(n // nb, nb, groups)], 1)  # [blocks, 2, NB, K/G]
    dm = dm.permute(0, 3, 1, 2).contiguous()  # [blocks, K/G, 2, NB]
    half = dm.half()
    return pack_quads(q), half if torch.equal(half.float(), dm) else dm


def layout_of(packed: tuple[torch.Tensor, torch.Tensor]) -> str:
    """The layout (LAYOUTS) of pack()'s answer, by its scales' dtype and shape."""
    qs, scales = packed
    if qs.dim() != 3 or qs.shape[2] != 2 * q4_kernel.BLOCK:
        raise ValueError(f"4-bit codes {tuple(qs.shape)} are not pack_quads' [N/NB, K/4, 64] "
                         "(q4_kernel.pack_grid's are the fp32-input kernel's)")
    if scales.dtype == torch.float32 and scales.dim() == 4:
        return "f32"
    if scales.dtype == torch.float16 and scales.dim() in (3, 4):
        return "q4_1" if scales.dim() == 4 else "q4_0"
    raise ValueError(f"4-bit scales of dtype {scales.dtype} and shape {tuple(scales.shape)} are no layout here")


def shape_of(packed: tuple[torch.Tensor, torch.Tensor]) -> tuple[int, int]:
    """(N, K) of the weight pack() laid out."""
    qs = packed[0]
    return qs.shape[0] * q4_kernel.BLOCK, qs.shape[1] * 4


def descriptor(packed: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """linear_coded's int64 [tag, codes, scales] for `packed`: the C decode
    layers call one function for every layer, whatever each one's layout."""
    return torch.tensor([LAYOUTS[layout_of(packed)][1], *(t.data_ptr() for t in packed)], dtype=torch.int64)

