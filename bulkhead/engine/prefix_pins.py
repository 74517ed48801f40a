"""The scheduler's side of the prefix cache: which cached pages a request reads. Pure Python.

A request's first chunk looks its prompt's whole pages up in its tenant's
cache (bulkhead.kv.prefix_cache) and pins what it finds (`req.shared_pages`,
read before its own pages). Pins drop when it is preempted or passed over
(it starts again from 0) and when it ends, when its computed prompt pages
join the cache. Without a cache every method is a no-op.

Invariant (check_integrity): each cached page's pin count equals the number
of running or kept requests that read it.
"""

from __future__ import annotations

from collections.abc import Iterable

from bulkhead.engine.request import Request
from bulkhead.kv.prefix_cache import CACHE_OWNER, PrefixCache, page_hashes, tenant_salt


class PrefixPins:
    def __init__(self, cache: PrefixCache | None, page_size: int, cache_secret: bytes):
        """cache_secret: server-side key that tenant cache salts derive from."""
        self.cache = cache
        self.page_size = page_size
        self._cache_secret = cache_secret

    def hash_prompt(self, req: Request, cache_salt: str | None) -> None:
        """Key req's whole prompt pages; never the whole prompt: its last
        token must be computed for logits."""
        if self.cache is None:
            return
        salt = tenant_salt(self._cache_secret, req.tenant, cache_salt, req.adapter)  # KV under other weights never matches
        req.prefix_hashes = page_hashes(salt, req.prompt_token_ids, self.page_size,
                                        max_pages=(len(req.prompt_token_ids) - 1) // self.page_size)

    def pin_cached_prefix(self, req: Request) -> None:
        """Before a waiting request's first chunk: read what its tenant's
        cache holds of its prompt (not with prompt logprobs, which need every
        position computed)."""
        if self.cache is None or req.num_computed or req.params.prompt_logprobs is not None:
            return
        req.shared_pages = self.cache.lookup(req.tenant, req.prefix_hashes, req.request_id)
        req.num_computed = len(req.shared_pages) * self.page_size

    def unpin(self, req: Request) -> None:
        """req starts again from position 0 (preempted, or its chunk did not fit)."""
        if self.cache is not None and req.shared_pages:
            self.cache.unpin(req.shared_pages)
        req.shared_pages = []
        req.num_computed = 0

    def retire(self, req: Request, own_pages: list[int]) -> None:
        """req ended holding own_pages: its full pages of computed prompt go
        to its tenant's cache; its pins are dropped."""
        if self.cache is None:
            return
        first = len(req.shared_pages)
        computed_pages = min(len(req.prefix_hashes), req.num_computed // self.page_size)
        if computed_pages > first:
            self.cache.insert(req.request_id, req.tenant, req.prefix_hashes[first:computed_pages],
                              own_pages[: computed_pages - first])
        self.cache.unpin(req.shared_pages)
        req.shared_pages = []

    @property
    def num_evictable(self) -> int:
        return self.cache.num_evictable if self.cache is not None else 0

    def evict(self, count: int) -> bool:
        """Free up to count unpinned cached pages; whether any were."""
        return self.cache is not None and bool(self.cache.evict(count))

    def check_integrity(self, readers: Iterable[Request], live: set[str]) -> None:
        """readers: every request that may hold pins (running and kept);
        adds the cache's owner id to live (the ledger's live owners)."""
        if self.cache is None:
            return
        live.add(CACHE_OWNER)
        self.cache.check_integrity()
        pinned: dict[int, int] = {}
        for r in readers:
            for p in r.shared_pages:
                pinned[p] = pinned.get(p, 0) + 1
        if pinned != self.cache.pins:
            raise AssertionError(f"cache pins {self.cache.pins} != pages requests read {pinned}")
