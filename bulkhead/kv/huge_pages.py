"""Memory for the KV pool and the laid-out weights, advised for transparent
huge pages.

Why: decode attention reads KV pages scattered over a pool of hundreds of
MiB, and a decode step streams every weight once; on 4 KiB pages each new
page costs a TLB miss and the prefetchers stop at each page boundary. On
2 MiB pages, decode attention took 0.91-0.93x the time and a one-row
SmolLM2 Q4_0 step ~0.9x (docs/performance.md). Many hosts run THP as
"madvise", where a torch allocation gets none. The advice is only advice:
without THP the memory stays on 4 KiB pages and nothing else changes.
"""

from __future__ import annotations

import math
import mmap

import torch

HUGE_PAGE = 2 * 2**20  # x86-64's transparent huge page


def advise(mapping: mmap.mmap, *span: int) -> bool:
    """Ask for huge pages over the whole mapping, or over span (start, length);
    False where the kernel or the platform refuses (no THP built in, no
    MADV_HUGEPAGE)."""
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE, *span)
    except (AttributeError, OSError, ValueError):
        return False
    return True


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed tensor on an arena (below). Every byte is written once here,
    as torch.zeros would, so the pool's memory is resident from the start."""
    count = math.prod(shape)
    data = arena(count * torch.empty((), dtype=dtype).element_size()).view(dtype).view(shape)
    return data.zero_()


def arena(nbytes: int, whole_pages_only: bool = False) -> torch.Tensor:
    """nbytes of uninitialised uint8 memory whose first byte is on a huge-page
    boundary, advised for huge pages, for callers to carve tensors out of
    (views of it keep its mapping alive: torch.frombuffer holds the buffer).
    whole_pages_only: the tail past the last whole huge page is not advised,
    so a small buffer (an adapter's) holds nbytes, not a huge page more."""
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    offset = -torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr() % HUGE_PAGE
    whole = nbytes // HUGE_PAGE * HUGE_PAGE
    if not whole_pages_only:
        advise(mapping)  # before the first touch: the faults then take huge pages
    elif whole:
        advise(mapping, offset, whole)
    return torch.frombuffer(mapping, dtype=torch.uint8, count=nbytes, offset=offset)
