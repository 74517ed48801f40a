"""Per-page digests: the same function on prefill and decode (invariant 3).

A page's bytes are taken layer by layer, K then V, i.e. the contiguous form of
pool.data[:, :, page] ([num_layers, 2, page_size, kv_heads, head_dim]).
"""

from __future__ import annotations

import torch
import xxhash

# Pages gathered per step: bounds the staging copy (~47 MB for SmolLM2 fp32).
_GATHER_PAGES = 64


def page_digests(pool, pages: list[int]) -> list[int]:
    """xxh3_64 of each page's bytes, in the order given."""
    out: list[int] = []
    data = pool.data
    for start in range(0, len(pages), _GATHER_PAGES):
        idx = torch.tensor(pages[start : start + _GATHER_PAGES], dtype=torch.long)
        # one gather, page-major so each page is contiguous. Advanced indexing on
        # the moved view: index_select along dim 2 measured ~8x slower here.
        chunk = data.movedim(2, 0)[idx]  # [n, L, 2, ps, H, D], contiguous
        raw = chunk.view(torch.uint8).reshape(len(idx), -1).numpy()  # bf16 has no numpy dtype
        out.extend(xxhash.xxh3_64_intdigest(row) for row in raw)
    return out


def page_digest(pool, page: int) -> int:
    return page_digests(pool, [page])[0]
