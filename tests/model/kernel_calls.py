"""One C linear kernel called from Python over a weight packed for it: what
the kernel tests compare against the exact arithmetic. The model's layers
call the same C functions through linear_kernel's and format_linear's
layers (the 4-bit codes through linear_coded's descriptor)."""

import torch

from bulkhead.model import c_linear, i16in_kernel, q4_kernel, q4_scales


def q4_pack(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """w [N, K] laid out for linear_q4 (q4_kernel.pack_grid), or None if w is not exactly on a 4-bit grid."""
    found = q4_kernel.grid(w)
    return None if found is None else q4_kernel.pack_grid(*found)


def linear_q4(x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [M, K] float32 @ w.T -> [M, N] float32, packed = q4_pack(w): fp32 inputs and sums."""
    qs, dm = packed
    blocks, k, _ = qs.shape
    return c_linear.call(c_linear.needed(q4_kernel.load(), "the 4-bit decode kernel").linear_q4, x, k,
                         blocks * q4_kernel.BLOCK, qs, dm)


def i16in_pack_q4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """w [N, K] laid out for the 16-bit-input 4-bit kernels (q4_scales.pack of its grid), or None."""
    found = q4_kernel.grid(w)
    return None if found is None else q4_scales.pack(*found)


def linear_q4_i16in(x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [M, K] float32 @ w.T -> [M, N] float32 through the C entry point of
    packed's scales' layout (q4_scales.LAYOUTS), x quantized to 16-bit integers per group inside the call."""
    lib = c_linear.needed(i16in_kernel.load(), "the 16-bit-input decode kernel")
    n, k = q4_scales.shape_of(packed)
    return c_linear.call(getattr(lib, q4_scales.LAYOUTS[q4_scales.layout_of(packed)][0]), x, k, n, *packed)


def bytes_per_weight(packed: tuple[torch.Tensor, torch.Tensor]) -> float:
    """What one decode row reads per weight of q4_scales.pack's answer: the codes and the scales."""
    n, k = q4_scales.shape_of(packed)
    return sum(t.nbytes for t in packed) / (n * k)


def linear_q8_i16in(x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [M, K] float32 @ w.T -> [M, N] float32, packed = i16in_kernel.pack_q8(w), x
    quantized to 16-bit integers per group inside the call."""
    qb, d = packed
    blocks, pairs = qb.shape[:2]
    lib = c_linear.needed(i16in_kernel.load(), "the 16-bit-input kernels")
    return c_linear.call(lib.linear_q8_i16in, x, 2 * pairs, blocks * q4_kernel.BLOCK, qb, d)
