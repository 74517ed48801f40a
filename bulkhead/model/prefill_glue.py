"""The glue of a prompt pass's layers in C (csrc/prefill_glue.c, the ops of
csrc/glue.h that the C decode layers use too): RMSNorm, the residual add
with the next RMSNorm, SiLU times up, and rotary on q and k, each one call
over every row, row-parallel in torch's OpenMP team.

Why: a 512-row prompt pass spent about 70 ms of ~420 in the ~15 torch ops
a layer around its matmuls and attention (docs/performance.md). Decode rows
have their own C path (bulkhead.model.decode_layers); this is the prompt
rows' counterpart, called from LlamaModel's layer loop, so the matmuls,
attention and the between-layers hook stay where they are.

The numbers: rotary, the residual add and the products are the same IEEE
operations as torch's (built with -ffp-contract=off); RMSNorm's sum of
squares and SiLU's exp differ from torch's in their last bits (glue.h).
It runs beside the reduced-precision linear kernels (the bundled model's
default among them); the exact kernels (`--linear-kernel onednn` or `aten`)
keep torch's ops, and `--prefill-glue torch` keeps them everywhere;
/server_info says which runs. Where it cannot be built (no compiler, torch
not on libgomp) prompts take the torch ops.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from bulkhead.model import kernel_names
from bulkhead.model import c_linear
from bulkhead.model.linear_kernel import REDUCED

SOURCE = Path(__file__).parent / "csrc" / "prefill_glue.c"
CHOICES = kernel_names.PREFILL_GLUE


@functools.cache
def load() -> ctypes.CDLL | None:
    """The library in torch's OpenMP team, or None where it cannot be built."""
    lib = c_linear.load_in_torch_team(SOURCE, "the C prompt glue: prompts' glue runs through torch",
                                      ("-ffp-contract=off",))
    if lib is None:
        return None
    p, i64, f32, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
    lib.rms_norm_rows.argtypes = [p, p, p, i64, i64, f32, i32]
    lib.add_rms_norm_rows.argtypes = [p, p, p, p, i64, i64, f32, i32]
    lib.silu_mul_rows.argtypes = [p, p, i64, i64, i32]
    lib.rope_rows.restype = ctypes.c_int
    lib.rope_rows.argtypes = [p, i64, p, i64, i64, i64, p, p, p, i64, i32]
    return lib


def choose(choice: str, linear_kernel: str, dtype: torch.dtype = torch.float32) -> str:
    """Resolve "auto": "c" where it builds, the model is float32 and the
    linear kernel is a reduced-precision one (linear_kernel.REDUCED),
    "torch" beside the exact kernels (aten, onednn), which keep the exact
    model's own ops; refuse "c" where it cannot run."""
    if choice not in CHOICES:
        raise ValueError(f"prefill glue must be one of {CHOICES}, not {choice!r}")
    if choice == "c" and (load() is None or dtype != torch.float32):
        raise RuntimeError("--prefill-glue c: its C file cannot be built here (no compiler, or torch not on "
                           f"libgomp), or the model is {dtype}, not float32")
    if choice == "auto":
        return "c" if load() is not None and dtype == torch.float32 and linear_kernel in REDUCED else "torch"
    return choice


def _check(*tensors: torch.Tensor, dims: tuple[int, ...] = ()) -> None:
    """Every tensor contiguous float32; the first len(dims) with those numbers of dimensions."""
    for t in tensors:
        if t.dtype != torch.float32 or not t.is_contiguous():
            raise ValueError(f"the C prompt glue takes contiguous float32 tensors, not {t.dtype} {tuple(t.shape)}")
    for t, n in zip(tensors, dims):
        if t.dim() != n:
            raise ValueError(f"the C prompt glue wants a {n}-D tensor here, not {tuple(t.shape)}")


def _check_weight(x: torch.Tensor, weight: torch.Tensor) -> None:
    if weight.shape != (x.shape[1],):
        raise ValueError(f"norm weight {tuple(weight.shape)} does not match rows of {x.shape[1]}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(x) * weight, x [T, D]."""
    _check(x, weight, dims=(2, 1))
    _check_weight(x, weight)
    h = torch.empty_like(x)
    load().rms_norm_rows(x.data_ptr(), weight.data_ptr(), h.data_ptr(), x.shape[0], x.shape[1], eps,
                         torch.get_num_threads())
    return h


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x += delta in place (the residual), then rms_norm(x) * weight."""
    _check(x, delta, weight, dims=(2, 2, 1))
    _check_weight(x, weight)
    if delta.shape != x.shape:
        raise ValueError(f"residual {tuple(delta.shape)} does not match {tuple(x.shape)}")
    h = torch.empty_like(x)
    load().add_rms_norm_rows(x.data_ptr(), delta.data_ptr(), weight.data_ptr(), h.data_ptr(), x.shape[0],
                             x.shape[1], eps, torch.get_num_threads())
    return h


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [T, 2 I] holding gate then up: [T, I]."""
    _check(gate_up, dims=(2,))
    t, two_i = gate_up.shape
    if two_i % 2:
        raise ValueError(f"gate_up {tuple(gate_up.shape)} must hold gate and up, two halves")
    act = torch.empty(t, two_i // 2)
    load().silu_mul_rows(gate_up.data_ptr(), act.data_ptr(), t, two_i // 2, torch.get_num_threads())
    return act


def rope(qkv: torch.Tensor, heads: int, head_dim: int, positions: torch.Tensor, cos: torch.Tensor,
         sin: torch.Tensor) -> torch.Tensor:
    """Rotary of the first heads * head_dim columns of each row of qkv [T,
    C] at positions [T]: [T, heads, head_dim]. A position outside the tables
    is a ValueError, raised before anything is written."""
    _check(qkv, cos, sin, dims=(2, 2, 2))
    positions = positions.to(torch.int64).contiguous()
    t = qkv.shape[0]
    if heads * head_dim > qkv.shape[1] or head_dim % 2 or cos.shape != sin.shape or cos.shape[1] != head_dim \
            or positions.shape != (t,):
        raise ValueError(f"rotary of {heads} x {head_dim} over qkv {tuple(qkv.shape)}, tables {tuple(cos.shape)} / "
                         f"{tuple(sin.shape)}, positions {tuple(positions.shape)}: shapes that do not fit")
    qk = torch.empty(t, heads, head_dim)
    if load().rope_rows(qkv.data_ptr(), qkv.shape[1], qk.data_ptr(), t, heads, head_dim, positions.data_ptr(),
                        cos.data_ptr(), sin.data_ptr(), cos.shape[0], torch.get_num_threads()):
        raise ValueError(f"a position outside the rotary tables (0..{cos.shape[0] - 1})")
    return qk
