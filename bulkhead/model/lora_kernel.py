"""The LoRA delta in C (csrc/lora_delta.c): one call for an adapter's down
projection and one per module for its up projection, each row summed alone
in a fixed order (batch-invariant by construction). Where it cannot be
built (no compiler, torch not on libgomp) bulkhead.model.lora_rows runs its
tiled torch matmuls instead."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from bulkhead.model import c_linear

SOURCE = Path(__file__).parent / "csrc" / "lora_delta.c"


@functools.cache
def load() -> ctypes.CDLL | None:
    lib = c_linear.load_in_torch_team(SOURCE, "the C LoRA delta: adapter rows take torch matmuls",
                                      ("-ffp-contract=off",))
    if lib is None:
        return None
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.lora_down.argtypes = [p, i64, p, i64, p, i64, i64, p, i32]
    lib.lora_up.argtypes = [p, i64, p, i64, p, i64, i64, i64, p, i64, i64, i32]
    return lib


def add_delta(lib: ctypes.CDLL, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor, delta) -> None:
    """y[rows] += each part's B @ (A @ x[rows]) in its columns (a FusedDelta of
    bulkhead.model.lora_weights); x and y fp32 with unit column stride."""
    threads = torch.get_num_threads()
    n, rank = rows.numel(), delta.a.shape[0]
    u = torch.empty(n, rank)
    lib.lora_down(x.data_ptr(), x.stride(0), rows.data_ptr(), n, delta.a.data_ptr(), rank, delta.a.shape[1],
                  u.data_ptr(), threads)
    for part in delta.parts:
        lib.lora_up(u.data_ptr(), rank, rows.data_ptr(), n, part.b.data_ptr(), part.b.shape[0], part.ranks[0],
                    part.ranks[1] - part.ranks[0], y.data_ptr(), y.stride(0), part.cols[0], threads)


def usable(x: torch.Tensor, y: torch.Tensor) -> bool:
    """The C call takes fp32 rows with unit column stride."""
    return (x.dtype == y.dtype == torch.float32 and x.stride(-1) == 1 and y.stride(-1) == 1
            and x.dim() == y.dim() == 2)
