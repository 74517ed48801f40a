"""Prompt rows through bf16 weights with bf16 inputs and fp32 sums and
outputs (csrc/linear_bf16.h, run by csrc/linear.c's driver: bulkhead.model.c_linear).

Why: a prompt's pass is bound by arithmetic, and AVX-512 BF16's dot product
does twice the multiply-adds of an fp32 FMA. Each weight is rounded to bf16
once, at load, and each input once a call; every sum and every output stays
fp32 (oneDNN's bf16 GEMM also rounds its output to bf16, and answered the
README's question in French). Rounding the weight, rather than keeping the
4-bit weights exact with a per-group scaling, runs 1.2-1.3x faster and moved
the mean KL to the exact model from 5.1e-5 to 6.0e-5 nats
(docs/performance.md, "Quality").

`linear_bf16in_silu_mul` runs a gate_up layer and SiLU times up in one pass
(glue.h's silu_mul on each block's sums as they leave the registers), its
output rounded to bf16 as the down projection would round it: the same
numbers as two passes, without writing and reading back the [rows, 2 I]
gate_up output.

Where the CPU has no AVX-512 BF16, `load()` is None and prompts stay on oneDNN fp32.
"""

from __future__ import annotations

import ctypes

import torch

from bulkhead.model import c_linear

BLOCK = c_linear.BLOCK  # outputs per packed block; N must be a multiple of it


def load() -> ctypes.CDLL | None:
    """The C linear kernels (bulkhead.model.c_linear), or None where they
    cannot be built or this CPU has no AVX-512 BF16."""
    return c_linear.load_with("avx512_bf16")


def fits(w: torch.Tensor) -> bool:
    return w.dim() == 2 and w.shape[0] % BLOCK == 0 and w.shape[1] % 2 == 0 and w.numel() > 0


def pack(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] rounded to bf16 and laid out as the kernel reads it:
    [N / BLOCK, K / 2, BLOCK, 2] (pairs along the input, one output per fp32 lane)."""
    if not fits(w):
        raise ValueError(f"the bf16-input prompt kernel takes [N, K] with N a multiple of {BLOCK} and K even, "
                         f"not {tuple(w.shape)}")
    n, k = w.shape
    return w.to(torch.bfloat16).reshape(n // BLOCK, BLOCK, k // 2, 2).transpose(1, 2).contiguous()


def linear_bf16in(x: torch.Tensor, wb: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32 @ w.T -> [M, N] float32, wb = pack(w); x is rounded
    to bf16 inside the call, or read as it is where it is bfloat16 already
    (linear_bf16in_silu_mul's output): the same numbers either way."""
    lib = c_linear.needed(load(), "the bf16-input prompt kernel")
    blocks, pairs = wb.shape[:2]
    k = 2 * pairs
    if x.dtype == torch.bfloat16:
        return c_linear.call(lib.linear_bf16in_rounded, x, k, blocks * BLOCK, wb, in_dtype=torch.bfloat16)
    rows = x.shape[0] if x.dim() == 2 else 0  # a wrong shape is refused by c_linear.call, below
    scratch = torch.empty(rows, k, dtype=torch.bfloat16)  # x rounded to bf16, once for every block
    return c_linear.call(lib.linear_bf16in, x, k, blocks * BLOCK, wb, scratch)


def linear_bf16_bf16in(x: torch.Tensor, wb: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32 @ w.T -> [M, N] float32 for wb = pack(w): decode
    rows of a bf16 checkpoint with x rounded to bf16 and fp32 sums, each
    row's numbers linear_bf16in's for the same row (csrc/linear_bf16.h says
    why decode rows take it: at 16 rows fp32 inputs are bound by arithmetic)."""
    lib = c_linear.needed(load(), "the bf16-weight kernels")
    blocks, pairs = wb.shape[:2]
    return c_linear.call(lib.linear_bf16_bf16in, x, 2 * pairs, blocks * BLOCK, wb, NO_SECOND_WEIGHT)


# The C decode layers hand every kernel two weight tensors (linear_q4's
# signature); a bf16 weight is one, so its second is this empty one.
NO_SECOND_WEIGHT = torch.empty(0)


def silu_mul_fits(wb: torch.Tensor) -> bool:
    """A packed gate_up weight whose halves (gate, up) are whole blocks each."""
    return wb.shape[0] % 2 == 0


def linear_bf16in_silu_mul(x: torch.Tensor, wb: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x [M, K] float32 and wb = pack(gate_up) holding
    gate's outputs then up's: [M, N / 2] bfloat16, what
    prefill_glue.silu_mul(linear_bf16in(x, wb)) gives rounded as the down
    projection's call rounds its input (so linear_bf16in of either gives the
    same numbers), in one pass that never writes the [M, N] gate_up output."""
    lib = c_linear.needed(load(), "the bf16-input prompt kernel")
    if not silu_mul_fits(wb):
        raise ValueError(f"gate_up's packed weight {tuple(wb.shape)} has an odd number of {BLOCK}-output blocks")
    blocks, pairs = wb.shape[:2]
    k = 2 * pairs
    rows = x.shape[0] if x.dim() == 2 else 0
    scratch = torch.empty(rows, k, dtype=torch.bfloat16)
    return c_linear.call(lib.linear_bf16in_silu_mul, x, k, blocks * BLOCK // 2, wb, scratch,
                         out_dtype=torch.bfloat16)
