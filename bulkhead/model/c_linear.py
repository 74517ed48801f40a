"""The one C library of linear kernels (csrc/linear.c: one driver, a
micro-kernel per weight format; its header comment says why blocks are
handed out dynamically), how it is built and loaded to run in torch's
OpenMP team (the prompt-attention kernel loads the same way), and how a
call checks its input and shapes. The format modules (q4_kernel,
i16in_kernel, bf16in_kernel, head_kernel) pack weights for it; the kernel
table (bulkhead.model.kernel_table) says which runs where.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import subprocess
from pathlib import Path

import torch

from bulkhead.model import decode_kernel

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "linear.c"
# The instructions a format's micro-kernel needs, as /proc/cpuinfo names them
# (bulkhead.model.kernel_table), and what the engine keeps without them.
FEATURE_FALLBACK = {"avx512_bf16": "prompts stay fp32", "avx512_vnni": "decode rows stay on q4's fp32 inputs"}
_SHAPES = [ctypes.c_int64] * 3 + [ctypes.c_int]  # M, N, K, threads
# Every entry point's pointer arguments (x, weights, scratch, y), before _SHAPES.
_POINTERS = {"linear_q4": 4, "linear_q4_i16in": 4, "linear_q4_1_i16in": 4, "linear_q4_0_i16in": 4,
             "linear_q8_i16in": 4, "linear_q8_0_i16in": 4, "linear_q8a_i16in": 4,
             "linear_coded": 4, "linear_bf16w": 3, "linear_bf16in": 4,
             "linear_bf16in_rounded": 3, "linear_bf16in_silu_mul": 4, "linear_bf16_bf16in": 4}
BLOCK = 32  # the C driver's NB: outputs per packed block
GROUP = 32  # its G: inputs per scale group


@functools.cache
def load() -> ctypes.CDLL | None:
    """The linear kernels' library in torch's OpenMP team, or None where it
    cannot be built. -ffp-contract=off: its SiLU rounds as
    csrc/prefill_glue.c's does (glue.h); every other product in it is an
    explicit fused multiply-add."""
    lib = load_in_torch_team(SOURCE, "the C linear kernels: linear layers stay on oneDNN fp32",
                             ("-ffp-contract=off",))
    if lib is None:
        return None
    for name, pointers in _POINTERS.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p] * pointers + _SHAPES
    assert lib.block_outputs() == BLOCK and lib.group_inputs() == GROUP
    return lib


@functools.cache
def load_with(feature: str) -> ctypes.CDLL | None:
    """load() where its micro-kernels on `feature` ("avx512_bf16",
    "avx512_vnni") were built, which -march=native does where this CPU has
    it; None otherwise (logged once)."""
    lib = load()
    if lib is not None and not getattr(lib, f"has_{feature}")():
        log.info("no %s on this CPU: %s", feature, FEATURE_FALLBACK[feature])
        return None
    return lib


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


def needed(lib: ctypes.CDLL | None, what: str) -> ctypes.CDLL:
    """lib, where `what` (a kernel's name for the error) was loaded; else a RuntimeError."""
    if lib is None:
        raise RuntimeError(f"{what}: not available here")
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
