"""Moving pages' bytes off the engine thread without torch's thread team.

A transfer runs on a thread of its own (the prefill worker's transfer
executor, the tcp receiver's connection thread). A torch op there that is
big enough to go parallel (an indexed copy of a few pages is) starts a
second OpenMP team in the process, and libgomp, seeing more of its threads
than cores, then lets every team's waiting threads spin only ~100 rounds
before sleeping: the engine's own team slept and woke at each of a pass's
barriers. Measured (2-core machine, 16 clients, prompts only): the prefill
worker switched context 114,747 times in 12 s against colocated's 1,358,
its prompt passes took 1.25x colocated's, and a fifth of the machine sat
idle. numpy copies run on the calling thread alone, so these helpers copy
with numpy over the pool's bytes (bf16 has no numpy dtype, hence uint8).
"""

from __future__ import annotations

import numpy as np
import torch


def page_bytes(data: torch.Tensor) -> np.ndarray:
    """A page-major pool (or staging buffer) as [pages, bytes a page] uint8:
    a view of the same memory, no copy."""
    return data.view(torch.uint8).view(data.shape[0], -1).numpy()


def copy_pages(dst: torch.Tensor, dst_pages, src: torch.Tensor, src_pages) -> None:
    """dst page dst_pages[i] = src page src_pages[i], every layer's K and V,
    on the calling thread only. The caller has checked the lists
    (pages.check_page_lists) and the geometry."""
    to, frm = page_bytes(dst), page_bytes(src)
    for d, s in zip(dst_pages, src_pages):
        to[d] = frm[s]


def gather_pages(src: torch.Tensor, pages) -> np.ndarray:
    """The listed pages' bytes, in order, as one contiguous [n, bytes] array
    (a copy, made on the calling thread only)."""
    return page_bytes(src)[np.asarray(pages, dtype=np.int64)]
