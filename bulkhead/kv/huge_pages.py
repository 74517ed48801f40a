"""Memory for the KV pool, advised for transparent huge pages.

Why: decode attention reads a request's KV pages scattered over a pool of
hundreds of MiB; on 4 KiB pages each new page costs a TLB miss and a page
walk. In process, decode attention over a pool on 2 MiB pages took
0.91-0.93x the time it took on 4 KiB pages (SmolLM2, one request). Many
hosts (this project's machine among them) run THP as "madvise": only memory
advised with MADV_HUGEPAGE gets huge pages, and a torch allocation is not.

The advice is only advice: where the kernel has no THP, or its mode is
"never" (for a shared mapping: shmem_enabled "never"), the memory stays on
4 KiB pages and nothing else changes.
"""

from __future__ import annotations

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


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, mmap.mmap]:
    """A zeroed tensor on private anonymous memory whose first byte is on a
    huge-page boundary, advised for huge pages; the mapping is returned too
    (keep it while the tensor lives). Every byte is written once here, as
    torch.zeros would, so the pool's memory is resident from the start."""
    count = 1
    for n in shape:
        count *= n
    nbytes = count * torch.empty((), dtype=dtype).element_size()
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advise(mapping)  # before the first touch: the faults then take huge pages
    start = torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr()
    offset = -start % HUGE_PAGE
    data = torch.frombuffer(mapping, dtype=dtype, count=count, offset=offset).view(shape)
    data.zero_()
    return data, mapping
