"""Prompt rows through the 4-bit grid weights with bf16 inputs and fp32 sums
(csrc/linear_q4_bf16in.c), compiled and loaded as the decode kernel is
(bulkhead.model.q4_kernel).

Why: a prompt's pass is bound by arithmetic, and oneDNN's fp32 GEMM already
runs at the two cores' fp32 peak (~210 GFLOP/s here); AVX-512 BF16's dot
product does twice the multiply-adds per instruction. The weights' 4-bit q
is exact in bf16, so only the inputs are rounded: each group's products are
exact, its sum is scaled by the exact fp32 scale and offset, and nothing is
summed or returned in bf16. oneDNN's bf16 GEMM also rounds the weights and
its output; measured on the quality prompts (docs/performance.md "Quality")
it lands further from the exact model and answers the README's question in
French, where this kernel answers it as the fp32 model does.

`linear_q4_nibbles` is the same product for decode rows under the opt-in
`--linear-kernel q4-bf16in-all`: it reads the 4-bit kernel's own packing
(no second copy of the weights), and moves the model further from the
exact one than prompts alone do (docs/performance.md "Quality").

Where the CPU has no AVX-512 BF16 (the C file builds without it and says so
in `available()`), `load()` is None and prompts stay on oneDNN fp32.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from bulkhead.model import c_linear, q4_kernel

SOURCE = Path(__file__).parent / "csrc" / "linear_q4_bf16in.c"
BLOCK = q4_kernel.BLOCK  # the C file's NB; the scales and offsets are q4's, shared
GROUP = q4_kernel.GROUP


@functools.cache
def load() -> ctypes.CDLL | None:
    """The library in torch's OpenMP team (bulkhead.model.c_linear), or None
    where it cannot be built or this CPU has no AVX-512 BF16."""
    lib = c_linear.load_for_isa_in_torch_team(
        SOURCE, "the bf16-input prompt kernel: prompts stay fp32", "AVX-512 BF16")
    if lib is None:
        return None
    lib.linear_q4_bf16in.restype = ctypes.c_int
    lib.linear_q4_bf16in.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    lib.linear_q4_nibbles_bf16in.restype = ctypes.c_int
    lib.linear_q4_nibbles_bf16in.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    assert lib.block_outputs() == BLOCK and lib.group_inputs() == GROUP
    return lib


def pack_q(w: torch.Tensor) -> torch.Tensor | None:
    """w's 4-bit q as the kernel reads it: bf16 [N / BLOCK, K / 2, BLOCK, 2]
    (pairs along the input, one output per fp32 lane), or None if w is not
    exactly on a 4-bit grid. Its scales and offsets are q4_kernel.pack's."""
    found = q4_kernel.grid(w)
    if found is None:
        return None
    n, k = w.shape
    q = found[0].reshape(n // BLOCK, BLOCK, k // 2, 2).transpose(1, 2)
    return q.to(torch.bfloat16).contiguous()


def linear_q4_bf16in(x: torch.Tensor, qb: torch.Tensor, dm: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32 @ w.T -> [M, N] float32, qb = pack_q(w), dm =
    q4_kernel.pack(w)[1]; x is rounded to bf16 inside the call."""
    lib = load()
    if lib is None:
        raise RuntimeError("the bf16-input prompt kernel is not available")
    blocks, pairs = qb.shape[:2]
    k = 2 * pairs
    rows = x.shape[0] if x.dim() == 2 else 0  # a wrong shape is refused by c_linear.call, below
    # Scratch for the call: x rounded to bf16, and each group's sum of it.
    scratch = torch.empty(rows, k, dtype=torch.bfloat16), torch.empty(rows, k // GROUP)
    return c_linear.call(lib.linear_q4_bf16in, x, k, blocks * BLOCK, qb, dm, *scratch)


def linear_q4_nibbles(x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [M, K] float32 @ w.T -> [M, N] float32 from q4's own packing
    (packed = q4_kernel.pack(w): 4 bits a weight, no bf16 copy of q), x
    rounded to bf16 inside the call: decode rows under `q4-bf16in-all`."""
    lib = load()
    if lib is None:
        raise RuntimeError("the bf16-input kernel is not available")
    return q4_kernel.call_packed(lib.linear_q4_nibbles_bf16in, x, packed)
