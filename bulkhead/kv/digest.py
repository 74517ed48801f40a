"""Per-page digests of the KV pool: the same function on prefill and decode
(invariant 3), and for the transfer backends (bulkhead/disagg/transfer).

A page's bytes are pool.data[page] ([num_layers, 2, page_size, kv_heads,
head_dim], one contiguous range in the page-major pool), hashed in place.
"""

from __future__ import annotations

import numpy as np
import torch
import xxhash


def page_bytes(data: torch.Tensor) -> np.ndarray:
    """A page-major pool's data (or a staging buffer of whole pages) as
    [pages, bytes a page] uint8: a view of the same memory, no copy (bf16 has
    no numpy dtype, hence bytes). The transfer backends copy through it too."""
    return data.view(torch.uint8).view(data.shape[0], -1).numpy()


def page_digests(pool, pages: list[int]) -> list[int]:
    """xxh3_64 of each page's bytes, in the order given."""
    data = pool.data
    for p in pages:
        if not 0 <= p < pool.num_pages:
            raise IndexError(f"page {p} outside the pool of {pool.num_pages} pages")
    raw = page_bytes(data)
    return [xxhash.xxh3_64_intdigest(raw[p]) for p in pages]


def page_digest(pool, page: int) -> int:
    return page_digests(pool, [page])[0]
