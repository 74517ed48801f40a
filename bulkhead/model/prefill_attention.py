"""A prompt chunk's causal attention on bf16 dot products
(csrc/prefill_attention_bf16.c), compiled and loaded as the linear kernels
are (bulkhead.model.c_linear).

Why: a 4,096-token prompt spends over half its time in attention, and
torch's fp32 flash kernel runs it at ~130 GFLOP/s on this project's two
cores; with AVX-512 BF16 the C kernel does the same flash-style sums on
bf16 dot products (twice an fp32 FMA's multiply-adds). q, K and V are
rounded to bf16 (K and V are stored in bf16 anyway under the default KV
cache), the probabilities are rounded to bf16 for the value sum; every
score, softmax sum and output stays fp32. Its distance from fp32 attention
is measured in docs/performance.md ("Quality").

Beside it, `write_kv` puts a prompt's K and V rows into a bf16 pool in C:
the values torch's indexed write stores (a NaN as a NaN), ~3 ms less a
256-token pass (docs/performance.md).

`choose` takes it ("bf16") where prompts already round their inputs to bf16
(`--linear-kernel q4-i16in`, `gguf-i16in` or `bf16`) and it builds here;
"torch" (fp32 SDPA) everywhere else, so the exact kernels keep exact
attention.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from bulkhead.model import kernel_names
from bulkhead.model import c_linear
from bulkhead.model.linear_kernel import BF16_INPUT_PROMPTS

SOURCE = Path(__file__).parent / "csrc" / "prefill_attention_bf16.c"
CHOICES = kernel_names.PREFILL_ATTENTION


@functools.cache
def load() -> ctypes.CDLL | None:
    """The library in torch's OpenMP team, or None where it cannot be built
    or this CPU has no AVX-512 BF16."""
    lib = c_linear.load_for_isa_in_torch_team(
        SOURCE, "the bf16 prompt-attention kernel: prompts' attention stays fp32", "AVX-512 BF16")
    if lib is None:
        return None
    fn = lib.prefill_attention_bf16
    fn.restype = ctypes.c_int
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p] * 7 + [i64] * 5 + [ctypes.c_float] + [i64] * 4 + [ctypes.c_int]  # ..., scale, row strides
    lib.write_kv_bf16.restype = ctypes.c_int
    lib.write_kv_bf16.argtypes = [p] * 2 + [i64] * 2 + [p] * 4 + [i64] * 7 + [ctypes.c_int]
    return lib


def choose(choice: str, linear_kernel: str, head_dim: int) -> str:
    """Resolve "auto"; refuse "bf16" where it cannot run."""
    if choice not in CHOICES:
        raise ValueError(f"prefill attention must be one of {CHOICES}, not {choice!r}")
    usable = load() is not None and head_dim == load().head_dim()
    if choice == "bf16" and not usable:
        raise RuntimeError(f"--prefill-attention bf16: its C kernel cannot run here (no AVX-512 BF16, no compiler, "
                           f"or head_dim {head_dim} is not {load().head_dim() if load() else 64})")
    if choice == "auto":
        return "bf16" if usable and linear_kernel in BF16_INPUT_PROMPTS else "torch"
    return choice


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t [rows, heads, hd] as the kernel reads it: float32, each row's heads
    contiguous; a view into wider rows (the pass's qkv) is taken as it is."""
    t = t.float()
    return t if t.stride(2) == 1 and t.stride(1) == t.shape[2] else t.contiguous()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of q [Tq, H, hd] over k, v [L, KVH, hd] (float32; the
    queries are the last Tq of the L positions) -> [Tq, H, hd] float32, or
    written into `out` [Tq, H * hd] (float32, rows of contiguous heads) and
    returned as that. Views into wider rows are read in place."""
    lib = load()
    if lib is None:
        raise RuntimeError("the bf16 prompt-attention kernel is not available")
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape or q.shape[2] != k.shape[2]:
        raise ValueError(f"prefill attention takes q [Tq, H, hd] and k, v [L, KVH, hd], not q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    q, k, v = _rows(q), _rows(k), _rows(v)
    (tq, h, hd), (length, kvh, _) = q.shape, k.shape
    given = out is not None
    if not given:
        out = torch.empty(tq, h * hd)
    elif out.dtype != torch.float32 or out.shape != (tq, h * hd) or out.stride(1) != 1:
        raise ValueError(f"prefill attention writes float32 [{tq}, {h * hd}] rows, not {out.dtype} {tuple(out.shape)}")
    padded = -(-length // lib.key_block()) * lib.key_block()
    # Scratch: K and V as the kernel reads them (bf16, keys padded to a whole
    # block with zeros), and q rounded.
    kb = torch.empty(kvh * padded * hd, dtype=torch.bfloat16)
    vb, qb = torch.empty_like(kb), torch.empty(tq * h * hd, dtype=torch.bfloat16)
    if lib.prefill_attention_bf16(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), kb.data_ptr(),
                                  vb.data_ptr(), qb.data_ptr(), tq, length, h, kvh, hd, scale, q.stride(0),
                                  k.stride(0), v.stride(0), out.stride(0), torch.get_num_threads()):
        raise ValueError(f"prefill attention refused q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    return out if given else out.view(tq, h, hd)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, pages: torch.Tensor,
             offsets: torch.Tensor) -> bool:
    """Rows k, v [N, KVH, hd] into the pool's k_pages [P, KVH, hd, page_size]
    and v_pages [P, page_size, KVH, hd] at (pages[i], offsets[i]), as
    `k_pages[pages, :, :, offsets] = k.to(bfloat16)` (and v's) would store
    them: True where done; False, with nothing written, where this kernel
    does not take them (not loaded, not float32 rows into a bf16 pool, an
    inner layout it does not read), for the caller's torch write. A slot
    outside the pool is an IndexError, as torch's would be, raised before
    anything is written; so is a negative page, which torch's write would
    wrap to the last."""
    lib = load()
    if lib is None or k_pages.dtype != torch.bfloat16 or v_pages.dtype != torch.bfloat16 \
            or k.dtype != torch.float32 or v.dtype != torch.float32 or k.shape != v.shape or k.dim() != 3:
        return False
    n, kvh, hd = k.shape
    page_size = v_pages.shape[1]
    inner = (k_pages.shape[1:] == (kvh, hd, page_size) and k_pages.stride()[1:] == (hd * page_size, page_size, 1)
             and v_pages.shape[1:] == (page_size, kvh, hd) and v_pages.stride()[1:] == (kvh * hd, hd, 1)
             and k_pages.shape[0] == v_pages.shape[0])
    if not inner or any(t.stride(2) != 1 or t.stride(1) != hd for t in (k, v)):
        return False
    pages, offsets = pages.to(torch.int64).contiguous(), offsets.to(torch.int64).contiguous()
    if pages.shape != (n,) or offsets.shape != (n,):
        raise ValueError(f"{n} rows need {n} pages and offsets, not {tuple(pages.shape)} and {tuple(offsets.shape)}")
    if lib.write_kv_bf16(k.data_ptr(), v.data_ptr(), k.stride(0), v.stride(0), pages.data_ptr(), offsets.data_ptr(),
                         n, k_pages.data_ptr(), v_pages.data_ptr(), k_pages.stride(0), v_pages.stride(0),
                         k_pages.shape[0], page_size, kvh, hd, torch.get_num_threads()):
        raise IndexError(f"a KV write slot outside the pool ({k_pages.shape[0]} pages of {page_size})")
    return True
