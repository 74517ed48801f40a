"""The lm_head on bf16 weights with fp32 inputs, sums and logits
(csrc/linear_bf16w.h, run by csrc/linear.c's driver: bulkhead.model.c_linear).

Why: at one request the lm_head reads its whole weight for one row of
logits (SmolLM2's 49,152 x 576: 113 MB in fp32), so it is bound by memory
and bf16 weights halve its bytes; unlike a bf16 GEMM only the weights are
rounded (head_linear says why the logits stay fp32).
"""

from __future__ import annotations

import ctypes

import torch

from bulkhead.model import c_linear


BLOCK = c_linear.BLOCK  # outputs per packed block; N must be a multiple of it


def load() -> ctypes.CDLL | None:
    """The C linear kernels (bulkhead.model.c_linear), or None."""
    return c_linear.load()


def fits(w: torch.Tensor) -> bool:
    return w.dim() == 2 and w.shape[0] % BLOCK == 0 and w.shape[0] > 0


def pack(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] as the kernel reads it: bf16, [N / BLOCK, K, BLOCK]."""
    n, k = w.shape
    return w.to(torch.bfloat16).reshape(n // BLOCK, BLOCK, k).transpose(1, 2).contiguous()


def linear_bf16w(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32 @ w.T -> [M, N] float32, packed = pack(w)."""
    lib = c_linear.needed(load(), "the bf16-weight lm_head kernel")
    blocks, k, _ = packed.shape
    return c_linear.call(lib.linear_bf16w, x, k, blocks * BLOCK, packed)
