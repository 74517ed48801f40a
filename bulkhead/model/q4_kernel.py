"""Decode linear layers over 4-bit grid weights with fp32 inputs, sums and
outputs (csrc/linear_q4.h, run by csrc/linear.c's driver: bulkhead.model.c_linear).

Why: the bundled SmolLM2 ships as Q4_1, so each group of 32 inputs of an
output holds w = q * d + m with q in 0..15. A Q4_0 file's groups hold
w = d * (q - 8), the same form with m = -8 d (packed with d > 0 and m the
group's minimum, as below). Packed that way a decode step
reads 4 bits a weight, as torch's int4 kernel does, but nothing else is
rounded: `grid` refuses a weight it cannot rebuild bit for bit, and the
kernel keeps the inputs and every sum in fp32. So the decode rows compute
the exact model's numbers (up to the order of a sum), not torch's int4
kernel's bf16 inputs and bf16-rounded scales.
"""

from __future__ import annotations

import ctypes

import torch
from torch.utils.weak import WeakIdKeyDictionary

from bulkhead.model import c_linear

BLOCK = c_linear.BLOCK  # outputs per packed block
GROUP = c_linear.GROUP  # inputs per scale/offset pair


def load() -> ctypes.CDLL | None:
    """The C linear kernels (bulkhead.model.c_linear), or None."""
    return c_linear.load()


def fits(w: torch.Tensor) -> bool:
    return w.dim() == 2 and w.shape[0] % BLOCK == 0 and w.shape[1] % GROUP == 0 and w.numel() > 0


def _candidates(lo: torch.Tensor, hi: torch.Tensor) -> list[torch.Tensor]:
    """Scales to try per group: the fp16 value of the step (a GGUF block
    stores its scale in fp16), the fp16 values either side of it, the fp32
    step itself (a grid of fp32 scales), and last a Q4_0 block's |d|: its
    quantizer maps the group's largest |w| to q = 0, so |w| there is 8 |d|
    exactly, while its other end need not reach q = 15 (a step of
    (max - min) / 15 then misses: about half of a Q4_0 file's groups)."""
    step = (hi - lo) / 15
    half = step.half()
    down = torch.nextafter(half, torch.zeros_like(half)).float()
    up = torch.nextafter(half, torch.full_like(half, float("inf"))).float()
    return [half.float(), down, up, step, torch.maximum(hi.abs(), lo.abs()) / 8]


# grid()'s answer per weight tensor, while the tensor lives: the engine asks
# once to choose the kernel (linear_kernel.q4_usable) and again to pack, and
# each ask is a pass over every weight (about 1.2 s for SmolLM2). Weights
# are not changed after loading.
_GRIDS = WeakIdKeyDictionary()


def grid(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """w [N, K] as (q [N, K/G, G] in 0..15, d [N, K/G, 1], m [N, K/G, 1])
    with q * d + m == w bit for bit, or None if some group is not on such a
    grid. The group's minimum is m (its q is 0, as GGUF's Q4_1 quantizer
    makes it); d is the first candidate scale that rebuilds every element."""
    if w not in _GRIDS:
        _GRIDS[w] = _solve_grid(w)
    return _GRIDS[w]


def _solve_grid(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    if w.dtype != torch.float32 or not fits(w) or not bool(torch.isfinite(w).all()):
        return None
    groups = w.reshape(-1, GROUP)
    lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    d = torch.zeros_like(lo)
    q = torch.zeros_like(groups)
    todo = (hi != lo).squeeze(-1).nonzero().squeeze(-1)  # a constant group keeps d = 0, q = 0
    left = torch.arange(todo.numel())  # which of todo's groups no candidate has rebuilt yet
    for cands in _candidates(lo[todo], hi[todo]):
        group_ids, cand = todo[left], cands[left]
        g, m = groups[group_ids], lo[group_ids]
        cq = torch.round((g - m) / cand.clamp_min(torch.finfo(torch.float32).tiny)).clamp_(0, 15)
        # The kernel rebuilds a weight as fma(q, d, m): one rounding. So q * d
        # must be exact in fp32 (true of an fp16 d), and then q * d + m here,
        # two roundings of which the first is none, is the kernel's weight.
        exact_product = (cq.double() * cand.double()) == (cq * cand).double()
        exact = ((cq * cand + m) == g).all(-1) & exact_product.all(-1) & (cand.squeeze(-1) > 0)
        d[group_ids[exact]], q[group_ids[exact]] = cand[exact], cq[exact]
        left = left[~exact]
        if left.numel() == 0:
            break
    if left.numel():
        return None
    shape = (w.shape[0], -1)
    return q.reshape(*shape, GROUP).to(torch.uint8), d.reshape(*shape, 1), lo.reshape(*shape, 1)


def remember_grid(w: torch.Tensor, found: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    """Record grid(w)'s answer as the checkpoint stored it (a GGUF Q4_0/Q4_1
    tensor's codes: bulkhead.model.gguf_codes), so that no pass searches for
    it; a weight the kernel does not take (its shape, its dtype) keeps grid() None."""
    if w.dtype == torch.float32 and fits(w):
        _GRIDS[w] = found


def pack_grid(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """grid()'s (q [N, K/G, G], d and m [N, K/G, 1]) laid out for the kernel:
    (qs uint8 [N/NB, K, NB/2], dm fp32 [N/NB, K/G, 2, NB])."""
    n, k = q.shape[0], q.shape[1] * q.shape[2]
    q = q.reshape(n // BLOCK, BLOCK, k).transpose(1, 2)  # [blocks, K, NB]
    qs = (q[..., : BLOCK // 2] | (q[..., BLOCK // 2:] << 4)).contiguous()
    dm = torch.stack([d.reshape(n // BLOCK, BLOCK, -1), m.reshape(n // BLOCK, BLOCK, -1)], 1)  # [blocks, 2, NB, K/G]
    return qs, dm.permute(0, 3, 1, 2).contiguous()
