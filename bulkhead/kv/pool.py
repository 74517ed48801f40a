"""The physical KV cache: one preallocated tensor; layers get views of it."""

from __future__ import annotations

import torch

from bulkhead.kv import huge_pages
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.ledger import PageLedger
from bulkhead.lineage.sink import NULL_SINK

SCRUB_MODES = ("zero", "poison")
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pool_shape(layout: KVLayout, num_pages: int) -> tuple[int, ...]:
    return (num_pages, layout.num_layers, 2, layout.page_size, layout.num_kv_heads, layout.head_dim)


class KVPool:
    """data: [num_pages, num_layers, 2 (k, v), page_size, kv_heads, head_dim].

    Page-major: one page, every layer's K and V, is one contiguous range
    (737 KB for SmolLM2 fp32 at 16 positions), so a transfer, digest or scrub
    touches one range a page: Mooncake moved pages of 60 ranges at 0.31-0.44x
    its raw speed (bench/transfer.py). Inside a page V is position-major and
    K head-dim-major ([kv_heads, head_dim, page_size]), so decode attention
    reads a page's K as rows of consecutive positions: the C kernel computes
    16 scores per vector instruction (bulkhead/model/csrc). Outside the model
    a page is opaque bytes.

    Freed pages are scrubbed before the ledger hands them out again: "zero"
    in production; "poison" (NaN) makes a read of KV nobody wrote for the
    request show up as NaN logits in tests.
    """

    def __init__(self, layout: KVLayout, num_pages: int, scrub_mode: str = "zero", data: torch.Tensor | None = None):
        """data: storage instead of a private allocation (a transfer backend's
        shared mapping) of exactly the pool's shape and dtype, zeroed here and
        its owner's to advise; a private allocation gets huge pages (huge_pages.py)."""
        if scrub_mode not in SCRUB_MODES:
            raise ValueError(f"scrub mode {scrub_mode!r} is not one of {SCRUB_MODES}")
        self.layout = layout
        self.num_pages = num_pages
        self.scrub_mode = scrub_mode
        shape = pool_shape(layout, num_pages)
        dtype = _TORCH_DTYPES[layout.dtype]
        if data is None:
            data = huge_pages.zeros(shape, dtype)
        elif tuple(data.shape) != shape or data.dtype != dtype:
            raise ValueError(f"pool storage is {tuple(data.shape)} {data.dtype}, expected {shape} {dtype}")
        else:
            data.zero_()
        self.data = data
        if scrub_mode == "poison":
            self.data.fill_(float("nan"))  # never-used pages are as unreadable as freed ones
        self.pages_scrubbed = 0
        # Told of every scrub, the one record that a page's bytes are gone
        # (bulkhead.lineage); the builder gives it the ledger's sink.
        self.lineage = NULL_SINK

    @property
    def num_tokens(self) -> int:
        return self.num_pages * self.layout.page_size

    def layer_views(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(k, v) per layer, sharing storage: k [num_pages, kv_heads, head_dim,
        page_size], v [num_pages, page_size, kv_heads, head_dim]. Strided over
        pages (stride(0) is a whole page of every layer); each page contiguous."""
        lay = self.layout
        k_shape = (self.num_pages, lay.num_kv_heads, lay.head_dim, lay.page_size)
        return [(self.data[:, i, 0].view(k_shape), self.data[:, i, 1]) for i in range(lay.num_layers)]

    def scrub(self, pages: list[int]) -> None:
        if not pages:
            return
        value = float("nan") if self.scrub_mode == "poison" else 0.0
        self.data.index_fill_(0, torch.tensor(pages, dtype=torch.long), value)
        self.pages_scrubbed += len(pages)
        if self.lineage.enabled:
            self.lineage.scrubbed(pages, self.scrub_mode)

    def page_bytes(self, page: int) -> torch.Tensor:
        """A copy of one page across all layers (tests and digests)."""
        return self.data[page].clone()


def scrub_released(pool: KVPool, ledger: PageLedger) -> int:
    """Scrub every page the ledger holds as released, then let it hand them out."""
    dirty = ledger.dirty_pages()
    if dirty:
        pool.scrub(dirty)
        ledger.mark_scrubbed(dirty)
    return len(dirty)


def release_unscrubbed(ledger: PageLedger) -> int:
    """Benchmark only (`--unsafe-no-guards`): hand released pages out again
    with the previous owner's KV still in them, to measure what scrubbing costs."""
    dirty = ledger.dirty_pages()
    if dirty:
        ledger.mark_scrubbed(dirty)
    return len(dirty)
