"""Linear layers with their inputs as 16-bit integers per group of 32
(csrc/linear_i16in.h, run by csrc/linear.c's driver: bulkhead.model.c_linear):
decode rows over the 4-bit grid weights (q4_scales' layouts, the decode
kernel of `--linear-kernel q4-i16in`) and over 8-bit grid weights
(`linear_q8_i16in`: a Q8_0 or Q5_0 layer's; the `q8-i16in` lm_head runs the
same arithmetic over the file's fp16 scales, head_linear).

Why: a 16-row decode step with fp32 inputs runs at the cores' fp32 FMA
peak. AVX-512 VNNI's 16-bit integer dot product does twice the
multiply-adds per instruction, and with q exact as an integer each group's
sum of products is exact in int32; only each input is rounded, to within
2^-16 of its group's largest |x| (bf16 inputs keep 2^-9 of each input:
about twenty times this kernel's error on SmolLM2's layers, measured in
tests/model/test_i16in_kernel.py).

Where the CPU has no AVX-512 VNNI, `load()` is None: decode rows stay on
linear_q4, the lm_head on bf16w.
"""

from __future__ import annotations

import ctypes

import torch
from torch.utils.weak import WeakIdKeyDictionary

from bulkhead.model import c_linear, q4_kernel

def load() -> ctypes.CDLL | None:
    """The C linear kernels (bulkhead.model.c_linear), or None where they
    cannot be built or this CPU has no AVX-512 VNNI."""
    return c_linear.load_with("avx512_vnni")


# q8_grid()'s answer per weight tensor, while it lives: the engine asks once
# to choose the lm_head's kernel and again to pack it (0.27 s a pass over
# SmolLM2's lm_head), as q4_kernel.grid caches its own.
_Q8_GRIDS = WeakIdKeyDictionary()


def q8_grid(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """w [N, K] as (q int8 [N, K/G, G] in -127..127, d fp32 [N, K/G, 1]) with
    q * d == w bit for bit in fp32, d of fp16 precision (as GGUF's Q8_0
    stores it, so q * d is one exact product), or None if some group is not
    on such a grid or the shape is not the kernel's. Weights are not changed
    after loading."""
    if w not in _Q8_GRIDS:
        _Q8_GRIDS[w] = _solve_q8_grid(w)
    return _Q8_GRIDS[w]


def _solve_q8_grid(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    if w.dtype != torch.float32 or not q4_kernel.fits(w) or not bool(torch.isfinite(w).all()):
        return None
    groups = w.reshape(w.shape[0], -1, q4_kernel.GROUP)
    amax = groups.abs().amax(-1, keepdim=True)
    d = (amax / 127).half().float()  # Q8_0's quantizer: d = max |w| / 127, stored in fp16
    q = torch.round(groups / d.clamp_min(torch.finfo(torch.float32).tiny)).clamp_(-127, 127)
    if not bool(((q * d) == groups).all()):
        return None
    return q.to(torch.int8), d


def pack_q8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """w [N, K] laid out for linear_q8_i16in: (q int8 [N/NB, K/2, 2, NB/2, 2]:
    for each input pair, outputs 0-15's two q then outputs 16-31's; d fp32
    [N/NB, K/G, NB]), or None if w is not exactly on an 8-bit grid."""
    found = q8_grid(w)
    return None if found is None else pack_q8_grid(*found)


def remember_q8_grid(w: torch.Tensor, found: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Record q8_grid(w)'s answer as the checkpoint stored it (a GGUF Q8_0
    tensor's codes: bulkhead.model.gguf_codes), so that no pass searches for it."""
    _Q8_GRIDS[w] = found


def pack_q8_grid(q: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q8_grid()'s (q [N, K/G, G], d [N, K/G, 1]) laid out as pack_q8 says."""
    n, k = q.shape[0], q.shape[1] * q.shape[2]
    nb = q4_kernel.BLOCK
    qb = q.reshape(n // nb, 2, nb // 2, k // 2, 2).permute(0, 3, 1, 2, 4).contiguous()
    return qb, d.reshape(n // nb, nb, -1).transpose(1, 2).contiguous()

