"""Tenant-scoped prefix cache over whole KV pages. Pure Python: no torch.

A full page of prompt KV is keyed by a hash chain that starts from a salt
derived on the server from the authenticated tenant (invariant 7):

    h(-1) = xxh3(HMAC(server_secret, tenant) [, then HMAC(.., adapter digest)] [, then HMAC(.., client cache_salt)])
    h(i)  = xxh3(h(i-1) || token ids of page i)

so one tenant's key can never equal another's, KV computed under a LoRA
adapter is never found by a request under other weights (the base model or
another adapter: bulkhead.lora), and a client salt can only split its own
tenant's space further. Cached pages are owned in the ledger by
CACHE_OWNER with their tenant recorded; a request may read one only if that
tenant is its own (Ledger.check_readable). A page a running request reads is
pinned; only unpinned pages are evicted (LRU), and eviction releases them to
be scrubbed like any freed page.
"""

from __future__ import annotations

import hashlib
import hmac
from array import array
from collections import OrderedDict

import xxhash

from bulkhead.kv.ledger import LedgerError, PageLedger

CACHE_OWNER = "<prefix-cache>"


def tenant_salt(server_secret: bytes, tenant: str, client_salt: str | None = None,
                adapter_digest: str | None = None) -> bytes:
    salt = hmac.new(server_secret, b"tenant:" + tenant.encode(), hashlib.sha256).digest()
    if adapter_digest:
        salt = hmac.new(salt, b"adapter:" + adapter_digest.encode(), hashlib.sha256).digest()
    if client_salt:
        salt = hmac.new(salt, b"client:" + client_salt.encode(), hashlib.sha256).digest()
    return salt


def page_hashes(salt: bytes, token_ids, page_size: int, max_pages: int | None = None) -> list[int]:
    """One hash per full page of token_ids (at most max_pages)."""
    h = xxhash.xxh3_64_intdigest(salt)
    out = []
    full = len(token_ids) // page_size if max_pages is None else min(max_pages, len(token_ids) // page_size)
    for i in range(full):
        chunk = array("q", token_ids[i * page_size : (i + 1) * page_size]).tobytes()
        h = xxhash.xxh3_64_intdigest(h.to_bytes(8, "little") + chunk)
        out.append(h)
    return out


class PrefixCache:
    def __init__(self, ledger: PageLedger):
        self.ledger = ledger
        self._page_of: dict[int, int] = {}  # hash -> page
        self._key_of: dict[int, tuple[int, str]] = {}  # page -> (hash, tenant)
        self._pins: dict[int, int] = {}  # page -> readers
        self._lru: OrderedDict[int, None] = OrderedDict()  # unpinned pages, oldest first
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @property
    def num_pages(self) -> int:
        return len(self._key_of)

    @property
    def num_evictable(self) -> int:
        return len(self._lru)

    @property
    def pins(self) -> dict[int, int]:
        return dict(self._pins)

    def lookup(self, tenant: str, hashes: list[int], reader: str | None = None) -> list[int]:
        """Pages of the longest cached prefix, pinned for the caller (request
        `reader`, named in the lineage log as having been handed them)."""
        pages = []
        for h in hashes:
            page = self._page_of.get(h)
            if page is None or self._key_of[page][1] != tenant:
                break
            pages.append(page)
        self.hits += len(pages)
        self.misses += len(hashes) - len(pages)
        self.pin(pages)
        lineage = self.ledger.lineage
        if pages and lineage.enabled:
            records = [self.ledger.record(p) for p in pages]
            lineage.cache_hit(reader, tenant, pages, [r.generation for r in records], [r.tenant for r in records])
        return pages

    def pin(self, pages: list[int]) -> None:
        for p in pages:
            self._pins[p] = self._pins.get(p, 0) + 1
            self._lru.pop(p, None)

    def unpin(self, pages: list[int]) -> None:
        for p in pages:
            n = self._pins[p] - 1
            if n:
                self._pins[p] = n
            else:
                del self._pins[p]
                self._lru[p] = None

    def insert(self, request_id: str, tenant: str, hashes: list[int], pages: list[int]) -> int:
        """Donate request_id's pages holding these full pages of prompt KV;
        pages whose hash is cached already stay with the request."""
        added = 0
        for h, p in zip(hashes, pages):
            if h in self._page_of:
                continue
            self.ledger.donate(request_id, p, CACHE_OWNER)
            self._page_of[h] = p
            self._key_of[p] = (h, tenant)
            self._lru[p] = None
            added += 1
        return added

    def evict(self, count: int) -> int:
        """Release up to `count` unpinned pages, least recently used first."""
        victims = []
        while self._lru and len(victims) < count:
            p, _ = self._lru.popitem(last=False)
            h, _ = self._key_of.pop(p)
            del self._page_of[h]
            victims.append(p)
        if victims:
            self.ledger.release_pages(CACHE_OWNER, victims)
        self.evictions += len(victims)
        return len(victims)

    def check_integrity(self) -> None:
        owned = set(self.ledger.pages_of(CACHE_OWNER))
        if owned != set(self._key_of):
            raise LedgerError(f"cache index {sorted(self._key_of)} != ledger's cache pages {sorted(owned)}")
        for p, (h, tenant) in self._key_of.items():
            if self._page_of.get(h) != p or self.ledger.record(p).tenant != tenant:
                raise LedgerError(f"cache entry for page {p} is inconsistent")
        if set(self._lru) & set(self._pins) or set(self._lru) | set(self._pins) != set(self._key_of):
            raise LedgerError("every cached page is either pinned or on the LRU list, never both")
