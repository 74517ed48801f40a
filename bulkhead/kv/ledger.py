"""The page allocator and its ownership ledger. Pure Python: no torch.

Every page of the pool is in exactly one of three states:

    state   | owner / tenant | may be handed out | how it leaves the state
    --------+----------------+-------------------+-------------------------------
    FREE    | None           | yes               | allocate(): generation += 1
    OWNED   | request,tenant | no                | release(): -> DIRTY
    DIRTY   | None           | no                | mark_scrubbed(): -> FREE

A page is FREE only after the pool has scrubbed it, so a new owner can never
read what the previous owner wrote. Free pages are handed out newest-first,
like the allocator in the incident: the tests then exercise the worst case.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from bulkhead.lineage.sink import NULL_SINK, LineageSink


class LedgerError(RuntimeError):
    """A violation of the ledger's rules: always a bug, never a user error."""


class OutOfPages(LedgerError):
    def __init__(self, wanted: int, free: int):
        super().__init__(f"wanted {wanted} pages, {free} free")
        self.wanted, self.free = wanted, free


@dataclass(frozen=True)
class PageRecord:
    page: int
    owner: str | None
    tenant: str | None
    generation: int
    dirty: bool


class PageLedger:
    def __init__(self, num_pages: int, lineage: LineageSink = NULL_SINK):
        """lineage: told of every transition (bulkhead.lineage); the default
        sink records nothing and decides nothing."""
        if num_pages <= 0:
            raise ValueError(f"num_pages must be positive, got {num_pages}")
        self.num_pages = num_pages
        self._owner: list[str | None] = [None] * num_pages
        self._tenant: list[str | None] = [None] * num_pages
        self._generation = [0] * num_pages
        self._free: list[int] = list(range(num_pages - 1, -1, -1))  # a stack
        self._dirty: list[int] = []
        self._pages_of: dict[str, list[int]] = {}
        self._tenant_of: dict[str, str] = {}
        # Pages handed out since start: a request refused before admission
        # must leave this unchanged (tests read it from /metrics and /server_info).
        self.pages_allocated = 0
        self.lineage = lineage

    # -- queries ---------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_dirty(self) -> int:
        return len(self._dirty)

    @property
    def num_owned(self) -> int:
        return self.num_pages - len(self._free) - len(self._dirty)

    def pages_of(self, request_id: str) -> list[int]:
        return list(self._pages_of.get(request_id, ()))

    def generation(self, page: int) -> int:
        return self._generation[page]

    def record(self, page: int) -> PageRecord:
        return PageRecord(page, self._owner[page], self._tenant[page], self._generation[page], page in self._dirty)

    def owned_by_tenant(self) -> dict[str, int]:
        return dict(Counter(self._tenant[p] for pages in self._pages_of.values() for p in pages))

    # -- transitions ---------------------------------------------------------
    def allocate(self, request_id: str, tenant: str, count: int) -> list[int]:
        """Give `count` scrubbed pages to request_id (appended to what it holds)."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        held_by = self._tenant_of.get(request_id)
        if held_by is not None and held_by != tenant:
            raise LedgerError(f"request {request_id} belongs to tenant {held_by}, not {tenant}")
        if count > len(self._free):
            raise OutOfPages(count, len(self._free))
        pages = [self._free.pop() for _ in range(count)]
        for p in pages:
            self._owner[p] = request_id
            self._tenant[p] = tenant
            self._generation[p] += 1
        self._pages_of.setdefault(request_id, []).extend(pages)
        self._tenant_of[request_id] = tenant
        self.pages_allocated += count
        if self.lineage.enabled:
            self.lineage.allocated(request_id, tenant, pages, [self._generation[p] for p in pages])
        return pages

    def release(self, request_id: str) -> list[int]:
        """Take every page from request_id; they stay unusable until scrubbed."""
        pages = self._pages_of.pop(request_id, None)
        if pages is None:
            raise LedgerError(f"release of {request_id}, which holds no pages (double free?)")
        del self._tenant_of[request_id]
        self._to_dirty(request_id, pages)
        return pages

    def _to_dirty(self, owner: str, pages: list[int]) -> None:
        if self.lineage.enabled:
            self.lineage.freed(owner, pages, [self._generation[p] for p in pages], [self._tenant[p] for p in pages])
        for p in pages:
            self._owner[p] = None
            self._tenant[p] = None
        # Reversed, so the next request gets this block in its old order: the
        # freshest KV lands where the next prompt goes (the incident's worst
        # case), as the model checker's ledger does (tests/verify/test_ledger_model_agrees.py).
        self._dirty.extend(reversed(pages))

    def donate(self, request_id: str, page: int, new_owner: str) -> None:
        """Move one page from request_id to new_owner (the prefix cache); the
        page keeps its tenant and generation: its KV is unchanged."""
        pages = self._pages_of.get(request_id)
        if pages is None or page not in pages:
            raise LedgerError(f"{request_id} cannot donate page {page}: it does not own it")
        pages.remove(page)
        if not pages:
            del self._pages_of[request_id]
            del self._tenant_of[request_id]
        self._pages_of.setdefault(new_owner, []).append(page)
        self._owner[page] = new_owner  # _tenant[page] stays: the KV is still that tenant's
        if self.lineage.enabled:
            self.lineage.donated(request_id, page, self._generation[page], new_owner)

    def release_pages(self, owner: str, pages: list[int]) -> None:
        """Release some of owner's pages (prefix-cache eviction) to be scrubbed."""
        held = self._pages_of.get(owner, [])
        stray = [p for p in pages if p not in held]
        if stray:
            raise LedgerError(f"{owner} does not own pages {stray}")
        drop = set(pages)
        self._pages_of[owner] = [p for p in held if p not in drop]
        if not self._pages_of[owner]:
            del self._pages_of[owner]
        self._to_dirty(owner, pages)

    def dirty_pages(self) -> list[int]:
        return list(self._dirty)

    def mark_scrubbed(self, pages: list[int]) -> None:
        dirty = set(self._dirty)
        stray = [p for p in pages if p not in dirty]
        if stray:
            raise LedgerError(f"pages {stray} marked scrubbed but were not dirty")
        done = set(pages)
        self._dirty = [p for p in self._dirty if p not in done]
        self._free.extend(pages)
        if self.lineage.enabled:
            self.lineage.reusable(pages)

    # -- guards ------------------------------------------------------------
    def check_readable(self, request_id: str, tenant: str, pages: list[int], shared_owner: str) -> None:
        """Raise unless each page is request_id's own, or a page of
        shared_owner (the prefix cache) holding this tenant's KV."""
        for p in pages:
            owner = self._owner[p]
            if owner == request_id:
                continue
            if owner == shared_owner and self._tenant[p] == tenant:
                continue
            raise LedgerError(f"request {request_id} ({tenant}) used page {p} owned by {owner} ({self._tenant[p]})")

    def check_integrity(self, live_requests: set[str] | None = None) -> None:
        """free + owned + dirty = total; no page twice; owners consistent and alive."""
        seen: dict[int, str] = {}
        for where, pages in (("free", self._free), ("dirty", self._dirty)):
            for p in pages:
                if p in seen:
                    raise LedgerError(f"page {p} is both {seen[p]} and {where}")
                seen[p] = where
                if self._owner[p] is not None:
                    raise LedgerError(f"{where} page {p} still names owner {self._owner[p]}")
        for rid, pages in self._pages_of.items():
            for p in pages:
                if p in seen:
                    raise LedgerError(f"page {p} is both {seen[p]} and owned by {rid}")
                seen[p] = rid
                if self._owner[p] != rid:
                    raise LedgerError(f"page {p} ledger entry disagrees with owner {rid}")
                # A request's pages carry its tenant; a shared owner's (the
                # prefix cache) each carry the tenant whose KV they hold.
                if self._tenant[p] is None or self._tenant_of.get(rid, self._tenant[p]) != self._tenant[p]:
                    raise LedgerError(f"page {p} tenant disagrees with owner {rid}")
            if live_requests is not None and rid not in live_requests:
                raise LedgerError(f"request {rid} owns pages but is not alive")
        if len(seen) != self.num_pages:
            raise LedgerError(f"{self.num_pages - len(seen)} pages are in no state (leaked)")
