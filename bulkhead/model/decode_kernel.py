"""The C decode-attention kernel (csrc/paged_decode_attention.c): compiled
once per machine with the system's C compiler, loaded with ctypes.

Why compiled here and not shipped: `-march=native` is what makes its loops
AVX-512 on this CPU class, and a binary built for one CPU can fault on
another; and it is compiled for one model's head_dim, query heads per KV head
and page size, so that its loops have constant bounds and keep their
accumulators in registers. The cache key holds the source, the flags (those
numbers included), the compiler's version and the CPU's feature flags.
Compiling takes under a second. Where
there is no compiler, or it fails, `load()` returns None and the model runs
decode attention through torch (bulkhead.model.attention), saying so in the
log and in /server_info.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from bulkhead.model import kernel_names
from bulkhead.model.gguf_import import cache_root

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_decode_attention.c"
# No -ffast-math: NaN from poisoned KV must reach the logits (invariant 6).
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-pthread")
_i64p = ctypes.POINTER(ctypes.c_int64)
_f32p = ctypes.POINTER(ctypes.c_float)
# The KV element types the kernel reads: the -D flag that builds it for each,
# and the torch dtype of the pool it takes (a 2-byte cache halves the bytes
# decode attention reads; each element is widened to fp32 as it is loaded).
KV_DTYPES = {"float32": ((), torch.float32), "bfloat16": (("-DKV_BF16",), torch.bfloat16),
             "float16": (("-DKV_F16",), torch.float16)}


class KernelError(RuntimeError):
    """The kernel refused its inputs (a page outside the pool, bad geometry)."""


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def torch_uses_libgomp() -> bool:
    """Whether this process runs torch's ops on GNU OpenMP (libgomp mapped).

    Then the kernel is built with -fopenmp and runs its items in torch's own
    thread team: the dynamic linker resolves its libgomp.so.1 to the copy
    torch loaded, whose workers spin between torch's ops. A pthread pool of
    the kernel's own found the second core taken by that spinning: a
    16-request decode step measured 63 ms in torch's team against 87-90 ms
    with the pool (docs/performance.md). Without libgomp (another OpenMP
    runtime, or none) the pthread pool stays: two runtimes would spin
    against each other."""
    try:
        with open("/proc/self/maps") as f:
            return any("libgomp" in line for line in f)
    except OSError:
        return False


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def _build(cc: str, flags: list[str], source: Path = SOURCE) -> Path:
    """The library of this C source for these flags, compiled once into the cache."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    text = source.read_text()
    # The headers it includes from its own folder (csrc/bf16.h) are part of what is compiled.
    headers = [(source.parent / name).read_text() for name in re.findall(r'^#include "([^"]+)"', text, re.M)]
    key = hashlib.sha256("\0".join([text, *headers, " ".join(flags), version, _cpu_flags()]).encode())
    target = cache_root() / "kernels" / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if not target.exists():
        log.info("compiling %s for this CPU (once per machine, cached in %s)", source.name, target.parent)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            subprocess.run([cc, *flags, str(source), "-o", str(built), "-lm"], check=True, capture_output=True,
                           text=True, timeout=120)
            os.replace(built, target)  # atomic: workers starting together may all compile
    return target


@functools.cache
def load(head_dim: int, group: int, page_size: int, kv_dtype: str = "float32") -> ctypes.CDLL | None:
    """The kernel built for this geometry (group = query heads per KV head)
    and KV element type, or None."""
    cc = _compiler()
    if cc is None:
        log.warning("no C compiler: decode attention runs through torch (slower)")
        return None
    flags = [*FLAGS, f"-DHEAD_DIM={head_dim}", f"-DGROUP={group}", f"-DPAGE_SIZE={page_size}",
             *KV_DTYPES[kv_dtype][0]]
    # In torch's OpenMP team where it has one, else (or where -fopenmp does
    # not build) the kernel's own pthread pool; both compute the same numbers.
    tries = [[*flags, "-fopenmp"], flags] if torch_uses_libgomp() else [flags]
    lib = error = None
    for attempt in tries:
        try:
            lib = ctypes.CDLL(str(_build(cc, attempt)))
            break
        except (OSError, subprocess.SubprocessError) as e:
            error = e
    if lib is None:
        detail = getattr(error, "stderr", "") or error
        log.warning("could not build the C decode-attention kernel (%s): decode attention runs through torch",
                    str(detail).strip()[:500])
        return None
    lib.uses_openmp.restype = ctypes.c_int
    fn = lib.paged_decode_attention
    fn.restype = ctypes.c_int64
    fn.argtypes = [_f32p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, _i64p, ctypes.c_int64, _i64p,
                   _i64p, _f32p,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_int]
    gather = lib.gather_k_position_major
    gather.restype = ctypes.c_int64
    gather.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, _i64p, ctypes.c_int64, ctypes.c_void_p,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return lib


def threading(lib: ctypes.CDLL) -> str:
    """How the loaded kernel spreads its items over threads ("openmp": torch's team)."""
    return "openmp" if lib.uses_openmp() else "pthreads"


CHOICES = kernel_names.DECODE_ATTENTION


def fits(kv_dtype: str, num_heads: int, num_kv_heads: int, head_dim: int, page_size: int) -> str | None:
    """Why the kernel cannot serve this model's KV, or None when it can
    (the limits are the C file's MAX_* constants)."""
    if kv_dtype not in KV_DTYPES:
        return f"KV dtype {kv_dtype} (the kernel reads {', '.join(KV_DTYPES)})"
    if head_dim > 256 or page_size > 256:
        return f"head_dim {head_dim} or page size {page_size} over 256"
    if num_heads % num_kv_heads or num_heads // num_kv_heads > 16:
        return f"{num_heads} query heads over {num_kv_heads} KV heads"
    return None


def choose(choice: str, kv_dtype: str, num_heads: int, num_kv_heads: int, head_dim: int, page_size: int) -> str:
    """Resolve "auto" to "c" where the kernel builds and fits, else "torch";
    asking for "c" where it cannot run is an error, not a fallback."""
    if choice not in CHOICES:
        raise ValueError(f"decode attention must be one of {CHOICES}, not {choice!r}")
    if choice == "torch":
        return "torch"
    why = fits(kv_dtype, num_heads, num_kv_heads, head_dim, page_size)
    if why is None and load(head_dim, num_heads // num_kv_heads, page_size, kv_dtype) is None:
        why = "it could not be compiled here (see the log)"
    if why is None:
        return "c"
    if choice == "c":
        raise RuntimeError(f"--decode-attention c: the C kernel cannot run: {why}")
    log.info("decode attention through torch: the C kernel cannot run: %s", why)
    return "torch"


def _kv_name(dtype: torch.dtype) -> str | None:
    return next((name for name, (_, t) in KV_DTYPES.items() if t == dtype), None)


def _pages_contiguous(*views: torch.Tensor) -> bool:
    """Each page of each view is one contiguous block, and every view steps
    from page to page by the same stride (the page-major pool's layer views,
    or a plain contiguous tensor)."""
    stride = views[0].stride(0)
    return all(v.stride(0) == stride and v[0].is_contiguous() and stride >= v[0].numel() for v in views)


def paged_decode_attention(
    q: torch.Tensor,  # [B, H, hd] float32
    k_pages: torch.Tensor,  # [num_pages, KVH, hd, page_size] one layer's pool views (bulkhead.kv.pool)
    v_pages: torch.Tensor,  # [num_pages, page_size, KVH, hd]
    pages: torch.Tensor,  # int64, each request's pages in position order, concatenated
    page_offset: torch.Tensor,  # [B] int64 where each request's pages start in `pages`
    kv_len: torch.Tensor,  # [B] int64 positions written
    scale: float,
) -> torch.Tensor:  # [B, H, hd]
    b, h, hd = q.shape
    kvh, page_size = v_pages.shape[2], v_pages.shape[1]
    kv_dtype = _kv_name(k_pages.dtype)
    lib = load(hd, h // kvh, page_size, kv_dtype) if kv_dtype else None
    if lib is None:
        raise KernelError(f"the C decode-attention kernel is not available for a {k_pages.dtype} pool")
    if not (_pages_contiguous(k_pages, v_pages) and q.dtype == torch.float32 and v_pages.dtype == k_pages.dtype):
        raise KernelError("the kernel reads float32 queries and pool views of one dtype whose pages are contiguous, "
                          "one stride apart")
    if any(t.dtype != torch.int64 or not t.is_contiguous() or t.dim() != 1 for t in (pages, page_offset, kv_len)):
        raise KernelError("pages, page_offset and kv_len must be contiguous 1-D int64 tensors")
    if page_offset.shape[0] != b or kv_len.shape[0] != b:
        raise KernelError(f"{b} query rows but {page_offset.shape[0]} page offsets and {kv_len.shape[0]} lengths")
    q = q.contiguous()
    out = torch.empty_like(q)
    ptr = lambda t, kind: ctypes.cast(t.data_ptr(), kind)  # noqa: E731
    rc = lib.paged_decode_attention(
        ptr(q, _f32p), k_pages.data_ptr(), v_pages.data_ptr(), k_pages.shape[0], k_pages.stride(0),
        ptr(pages, _i64p), pages.shape[0], ptr(page_offset, _i64p), ptr(kv_len, _i64p), ptr(out, _f32p),
        b, h, kvh, hd, page_size, scale, torch.get_num_threads())
    if rc > 0:
        raise page_list_refused(rc - 1, k_pages.shape[0])
    if rc < 0:
        raise KernelError("the decode-attention kernel refused its geometry or ran out of memory")
    return out


def page_list_refused(row: int, num_pages: int) -> KernelError:
    """The kernel's refusal of one decode row's page list (its positive return code, less one)."""
    return KernelError(f"decode row {row}'s page list runs past the page table or names a page outside "
                       f"the pool of {num_pages} pages")


def gather_k_position_major(k_pages: torch.Tensor, which: torch.Tensor, group: int) -> torch.Tensor | None:
    """The listed pages' K as [len(which) * page_size, KVH, hd] in the pool's
    dtype (the pool keeps it [KVH, hd, page_size] per page), or None where
    the library cannot be built (the caller permutes in torch then). group:
    query heads per KV head, part of the library's geometry."""
    kvh, hd, page_size = k_pages.shape[1:]
    kv_dtype = _kv_name(k_pages.dtype)
    lib = load(hd, group, page_size, kv_dtype) if kv_dtype else None
    if lib is None or not _pages_contiguous(k_pages):
        return None
    which = which.contiguous()
    out = torch.empty(which.shape[0] * page_size, kvh, hd, dtype=k_pages.dtype)
    rc = lib.gather_k_position_major(k_pages.data_ptr(), k_pages.shape[0], k_pages.stride(0),
                                     ctypes.cast(which.data_ptr(), _i64p), which.shape[0], out.data_ptr(), kvh, hd,
                                     page_size)
    if rc < 0:
        raise KernelError(f"pool page stride {k_pages.stride(0)} is shorter than a page")
    if rc:
        raise KernelError(f"page list entry {rc - 1} names a page outside the pool of {k_pages.shape[0]} pages")
    return out
