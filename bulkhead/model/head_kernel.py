"""The lm_head on bf16 weights with fp32 inputs, sums and logits
(csrc/linear_bf16w.c), compiled and loaded as the decode-attention kernel is
(bulkhead.model.decode_kernel).

Why: at one request the lm_head reads its whole weight for one row of
logits; SmolLM2's is 49,152 x 576, 113 MB in fp32, so the layer is bound by
memory and bf16 weights halve its bytes. Unlike a bf16 GEMM (oneDNN's, which
rounds its inputs and its output to bf16, so logits move in steps of 0.125
at 20), only the weights are rounded: the inputs, every sum and the logits
stay fp32. Its agreement with the exact fp32 lm_head is measured in
docs/performance.md and gated in tests/model.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from bulkhead.model import c_linear


SOURCE = Path(__file__).parent / "csrc" / "linear_bf16w.c"
BLOCK = 32  # the C file's NB: outputs per packed block; N must be a multiple of it


@functools.cache
def load() -> ctypes.CDLL | None:
    """The library in torch's OpenMP team (bulkhead.model.c_linear), or None."""
    lib = c_linear.load_in_torch_team(SOURCE, "the bf16-weight lm_head kernel: the lm_head stays fp32")
    if lib is None:
        return None
    lib.linear_bf16w.restype = ctypes.c_int
    lib.linear_bf16w.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                 ctypes.c_int64, ctypes.c_int]
    lib.block_outputs.restype = ctypes.c_int
    assert lib.block_outputs() == BLOCK
    return lib


def fits(w: torch.Tensor) -> bool:
    return w.dim() == 2 and w.shape[0] % BLOCK == 0 and w.shape[0] > 0


def pack(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] as the kernel reads it: bf16, [N / BLOCK, K, BLOCK]."""
    n, k = w.shape
    return w.to(torch.bfloat16).reshape(n // BLOCK, BLOCK, k).transpose(1, 2).contiguous()


def linear_bf16w(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32 @ w.T -> [M, N] float32, packed = pack(w)."""
    lib = load()
    if lib is None:
        raise RuntimeError("the bf16-weight lm_head kernel is not available")
    blocks, k, _ = packed.shape
    return c_linear.call(lib.linear_bf16w, x, k, blocks * BLOCK, packed)
