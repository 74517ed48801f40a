"""What the blocked C linear kernels share (csrc/linear_bf16w.c for the
lm_head, csrc/linear_bf16in.c for prompt rows, csrc/linear_q4.c for 4-bit
decode rows, csrc/linear_q4_bf16in.c for them under `q4-bf16in-all` and
csrc/linear_i16in.c under `q4-i16in`): how each is built and loaded to run
in torch's OpenMP team (the prompt-attention kernel loads the same way), and
how a call checks its input and shapes. The kernels differ in how they read
a weight, and the prompt kernel also takes a scratch buffer, passed after
the weight.

Each splits its outputs into blocks of 32 and hands the blocks out to the
team's threads as they free up (OpenMP's dynamic schedule), not in two fixed
halves: on a 2-core machine a thread is taken off its core whenever another
thread wakes (the HTTP server's, a link's, the other worker's), and with
fixed halves its partner then waited at the end of the call for the whole
time. Which thread computes a block never changes its numbers. Measured:
colocated at 16 clients, two alternating pairs of runs, 274.7 vs 234.7 and
270.5 vs 253.8 tok/s (docs/performance.md).
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
from pathlib import Path

import torch

from bulkhead.model import decode_kernel

log = logging.getLogger(__name__)


def load_in_torch_team(source: Path, what: str, flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The library of `source`, built with -fopenmp where torch runs on
    libgomp (the decode-attention kernel's reasoning: the work runs in
    torch's own thread team) and any further `flags`; None where it cannot be
    built, or without OpenMP (one thread of it would lose to torch's kernels
    on two). `what` names the kernel and its fallback in the warning."""
    cc = decode_kernel._compiler()
    if cc is None or not decode_kernel.torch_uses_libgomp():
        return None
    try:
        return ctypes.CDLL(str(decode_kernel._build(cc, [*decode_kernel.FLAGS, "-fopenmp", *flags], source)))
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("could not build %s (%s)", what, str(getattr(e, "stderr", "") or e).strip()[:500])
        return None


def load_for_isa_in_torch_team(source: Path, what: str, isa: str, flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """load_in_torch_team() for a kernel on instructions some CPUs lack
    (`isa` names them: "AVX-512 BF16", "AVX-512 VNNI"): None also where this
    CPU has none (the C file then builds without them and its available()
    says 0), which is logged once."""
    lib = load_in_torch_team(source, what, flags)
    if lib is not None and not lib.available():
        log.info("no %s on this CPU, so not %s", isa, what)
        return None
    return lib


def call(fn, x: torch.Tensor, k: int, n: int, *weights: torch.Tensor, in_dtype: torch.dtype = torch.float32,
         out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """y = x @ w.T through `fn(x, *weights, y, M, N, K, threads)`: x [M, K]
    float32, y [M, N] float32 (or in_dtype / out_dtype, where fn reads or
    writes another); a shape the kernel refuses is a ValueError."""
    x = x.contiguous()
    if x.dtype != in_dtype or x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x must be {str(in_dtype).removeprefix('torch.')} [M, {k}], not {x.dtype} "
                         f"{tuple(x.shape)}")
    y = torch.empty(x.shape[0], n, dtype=out_dtype)
    if x.shape[0] == 0:
        return y
    if fn(x.data_ptr(), *(w.data_ptr() for w in weights), y.data_ptr(), x.shape[0], n, k, torch.get_num_threads()):
        raise ValueError(f"{fn.__name__} refused x {tuple(x.shape)}, w [{n}, {k}]: a shape it does not take, "
                         "or no memory for its scratch")
    return y
