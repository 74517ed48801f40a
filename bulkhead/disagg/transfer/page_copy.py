"""Moving pages' bytes off the engine thread without torch's thread team.

A transfer runs on a thread of its own (the prefill worker's transfer
executor, the tcp receiver's connection thread). A torch op there that is
big enough to go parallel (an indexed copy of a few pages is) starts a
second OpenMP team in the process, and libgomp, seeing more of its threads
than cores, then lets every team's waiting threads spin only ~100 rounds
before sleeping. The engine's own team then slept and woke at each of a
pass's barriers, and the prefill worker's prompt passes took 1.25x
colocated's (docs/performance.md). numpy copies run on the calling thread alone, so
these helpers copy with numpy over the pool's bytes (kv.digest.page_bytes,
the view the digests hash).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from bulkhead.kv.digest import page_bytes


def copy_pages(src: torch.Tensor, src_pages: Sequence[int], dst: torch.Tensor, dst_pages: Sequence[int]) -> None:
    """dst page dst_pages[i] = src page src_pages[i], every layer's K and V,
    on the calling thread only (the order of TransferSource.write_pages'
    arguments). The caller has checked the lists (pages.check_page_lists)
    and the geometry."""
    src_bytes, dst_bytes = page_bytes(src), page_bytes(dst)
    for src_page, dst_page in zip(src_pages, dst_pages):
        dst_bytes[dst_page] = src_bytes[src_page]


def gather_pages(src: torch.Tensor, pages: Sequence[int]) -> np.ndarray:
    """The listed pages' bytes, in order, as one contiguous [n, bytes] array
    (a copy, made on the calling thread only)."""
    return page_bytes(src)[np.asarray(pages, dtype=np.int64)]
