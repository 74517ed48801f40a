"""Decode rows through the 4-bit grid weights with their inputs as 16-bit
integers (csrc/linear_q4_i16in.c), compiled and loaded as the other linear
kernels are (bulkhead.model.c_linear): the decode kernel of
`--linear-kernel q4-i16in`.

Why: a 16-row decode step runs linear_q4 (fp32 inputs and sums) at the two
cores' fp32 FMA peak. AVX-512 VNNI's 16-bit integer dot product does twice
the multiply-adds per instruction, and with the 4-bit q exact as an integer,
each group's sum of products is exact in int32; only each input is rounded,
to within 2^-16 of its group's largest |x| (bf16 inputs keep 2^-9 of each
input: about twenty times this kernel's error on SmolLM2's layers,
measured in tests/model/test_q4_i16in_kernel.py). It reads linear_q4's own
packing, with linear_q4's signature, so the C decode layers call either.

Where the CPU has no AVX-512 VNNI (the C file builds without it and says so
in `available()`), `load()` is None and decode rows stay on linear_q4.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from bulkhead.model import c_linear, q4_kernel

SOURCE = Path(__file__).parent / "csrc" / "linear_q4_i16in.c"


@functools.cache
def load() -> ctypes.CDLL | None:
    """The library in torch's OpenMP team, or None where it cannot be built
    or this CPU has no AVX-512 VNNI."""
    lib = c_linear.load_for_isa_in_torch_team(
        SOURCE, "the 16-bit-input decode kernel: decode rows stay on q4's fp32 inputs", "AVX-512 VNNI")
    if lib is None:
        return None
    lib.linear_q4_i16in.restype = ctypes.c_int
    lib.linear_q4_i16in.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    assert lib.block_outputs() == q4_kernel.BLOCK and lib.group_inputs() == q4_kernel.GROUP
    return lib


def linear_q4_i16in(x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [M, K] float32 @ w.T -> [M, N] float32 from q4's packing (packed =
    q4_kernel.pack(w)), x quantized to 16-bit integers per group inside the call."""
    lib = load()
    if lib is None:
        raise RuntimeError("the 16-bit-input decode kernel is not available")
    return q4_kernel.call_packed(lib.linear_q4_i16in, x, packed)
