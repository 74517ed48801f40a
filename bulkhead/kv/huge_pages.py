"""Memory for the KV pool and the laid-out weights, advised for transparent
huge pages.

Why: decode attention reads a request's KV pages scattered over a pool of
hundreds of MiB; on 4 KiB pages each new page costs a TLB miss and a page
walk. In process, decode attention over a pool on 2 MiB pages took
0.91-0.93x the time it took on 4 KiB pages (SmolLM2, one request). A decode
step streams every weight once, and the hardware prefetchers stop at each
4 KiB page: with the weights on 2 MiB pages (`arena`, which the machine
cache reads them into) a one-row SmolLM2 Q4_0 step took ~0.9x the time
(docs/performance.md). Many hosts (this project's machine among them) run
THP as "madvise": only memory advised with MADV_HUGEPAGE gets huge pages,
and a torch allocation is not.

The advice is only advice: where the kernel has no THP, or its mode is
"never" (for a shared mapping: shmem_enabled "never"), the memory stays on
4 KiB pages and nothing else changes.
"""

from __future__ import annotations

import math
import mmap

import torch

HUGE_PAGE = 2 * 2**20  # x86-64's transparent huge page


def advise(mapping: mmap.mmap) -> bool:
    """Ask for huge pages over the whole mapping; False where the kernel or
    the platform refuses (no THP built in, no MADV_HUGEPAGE)."""
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except (AttributeError, OSError, ValueError):
        return False
    return True


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed tensor on an arena (below). Every byte is written once here,
    as torch.zeros would, so the pool's memory is resident from the start."""
    count = math.prod(shape)
    data = arena(count * torch.empty((), dtype=dtype).element_size()).view(dtype).view(shape)
    return data.zero_()


def arena(nbytes: int) -> torch.Tensor:
    """nbytes of uninitialised uint8 memory whose first byte is on a huge-page
    boundary, advised for huge pages, for callers to carve tensors out of
    (views of it keep its mapping alive: torch.frombuffer holds the buffer)."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advise(mapping)  # before the first touch: the faults then take huge pages
    start = torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
    return torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes, offset=-start % HUGE_PAGE)
