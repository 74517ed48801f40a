"""Decode rows through the 4-bit grid weights with bf16 inputs and fp32 sums
(csrc/linear_q4_bf16in.c) under the opt-in `--linear-kernel q4-bf16in-all`,
compiled and loaded as the decode kernel is (bulkhead.model.q4_kernel).

It reads the 4-bit kernel's own packing (no second copy of the weights):
the 4-bit q is exact in bf16, so only the inputs are rounded, and each
group's sum is scaled by the exact fp32 scale and offset. It moves the model
further from the exact one than 16-bit integer inputs (`q4-i16in`, the
default) at the same speed (docs/performance.md "Quality"), so it is never
`auto`. Prompts take bulkhead.model.bf16in_kernel.

Where the CPU has no AVX-512 BF16 (the C file builds without it and says so
in `available()`), `load()` is None and `q4-bf16in-all` is refused.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from bulkhead.model import c_linear, q4_kernel

SOURCE = Path(__file__).parent / "csrc" / "linear_q4_bf16in.c"
BLOCK = q4_kernel.BLOCK  # the C file's NB: it reads q4's packing
GROUP = q4_kernel.GROUP


@functools.cache
def load() -> ctypes.CDLL | None:
    """The library in torch's OpenMP team (bulkhead.model.c_linear), or None
    where it cannot be built or this CPU has no AVX-512 BF16."""
    lib = c_linear.load_for_isa_in_torch_team(
        SOURCE, "the bf16-input 4-bit decode kernel (q4-bf16in-all)", "AVX-512 BF16")
    if lib is None:
        return None
    lib.linear_q4_nibbles_bf16in.restype = ctypes.c_int
    lib.linear_q4_nibbles_bf16in.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    assert lib.block_outputs() == BLOCK and lib.group_inputs() == GROUP
    return lib


def linear_q4_nibbles(x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [M, K] float32 @ w.T -> [M, N] float32 from q4's own packing
    (packed = q4_kernel.pack(w): 4 bits a weight, no bf16 copy of q), x
    rounded to bf16 inside the call: decode rows under `q4-bf16in-all`."""
    lib = load()
    if lib is None:
        raise RuntimeError("the bf16-input kernel is not available")
    return q4_kernel.call_packed(lib.linear_q4_nibbles_bf16in, x, packed)
