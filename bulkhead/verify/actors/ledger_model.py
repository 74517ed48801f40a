"""Decode's page ledger: who owns each page, at which generation, what was
written into it in which epoch, and (as the model sees physical memory) what
the page holds.

Index-range table of one pool of N pages:

    pages 0 .. N-1   each either on the free stack or owned by exactly one request
    free stack       LIFO: the last page freed is the first handed out, as the
                     incident's allocator did; safety must not depend on order
    generation       bumped on every allocation, never on free: a write posted
                     against generation g is refused once the page moved on
    content          survives free and restart unless scrubbed (GPU memory is
                     not zeroed by anyone else)
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from bulkhead.verify.actors.values import ZERO, cached_hash


@cached_hash
@dataclass(frozen=True)
class PageEntry:
    owner: int | None = None            # request id, None when free
    gen: int = 0
    written_epoch: int | None = None    # epoch of the last landed write for owner
    landed_digest: int | None = None    # digest of that write's payload, as received
    content: object = ZERO              # what a read would see


@cached_hash
@dataclass(frozen=True)
class Ledger:
    entries: tuple[PageEntry, ...]
    free: tuple[int, ...]               # stack, top at the end

    @classmethod
    def fresh(cls, pages: int) -> "Ledger":
        return cls(tuple(PageEntry() for _ in range(pages)), tuple(range(pages)))

    def allocate(self, rid: int, count: int) -> tuple["Ledger", tuple[int, ...]]:
        """Pop `count` pages, newest-freed first, and bump their generations."""
        if count > len(self.free):
            raise ValueError(f"asked for {count} pages, {len(self.free)} free")
        taken = tuple(reversed(self.free[len(self.free) - count:]))
        entries = list(self.entries)
        for page in taken:
            old = entries[page]
            entries[page] = PageEntry(owner=rid, gen=old.gen + 1, content=old.content)
        return Ledger(tuple(entries), self.free[:len(self.free) - count]), taken

    def release(self, pages: tuple[int, ...], scrub: bool) -> "Ledger":
        """Return pages to the free stack; zero them first when scrubbing so
        the next owner (and anything reading free memory) sees no one's KV."""
        entries = list(self.entries)
        for page in pages:
            content = ZERO if scrub else entries[page].content
            entries[page] = PageEntry(gen=entries[page].gen, content=content)
        # Pushed in reverse so the next allocation gets the same block in the
        # same order: the freshest KV lands exactly where the next prompt goes.
        return Ledger(tuple(entries), self.free + tuple(reversed(pages)))

    def land(self, page: int, rid: int, gen: int, epoch: int, payload, digest) -> "Ledger":
        """A DMA landed: memory changes whatever the ledger says; the ledger
        credits the write only to the owner at the generation it was posted
        against."""
        entry = self.entries[page]
        if entry.owner == rid and entry.gen == gen:
            entry = replace(entry, written_epoch=epoch, landed_digest=digest, content=payload)
        else:
            entry = replace(entry, content=payload)
        return self._with(page, entry)

    def write_local(self, page: int, payload) -> "Ledger":
        """Decode writes generated tokens' KV into its own pages."""
        return self._with(page, replace(self.entries[page], content=payload))

    def restarted(self, scrub: bool) -> "Ledger":
        """A new process maps the same memory: ownership is gone, content is
        not (unless scrubbed at start)."""
        contents = [ZERO if scrub else e.content for e in self.entries]
        return Ledger(tuple(PageEntry(content=c) for c in contents), tuple(range(len(contents))))

    def _with(self, page: int, entry: PageEntry) -> "Ledger":
        entries = list(self.entries)
        entries[page] = entry
        return Ledger(tuple(entries), self.free)

    def check_integrity(self) -> None:
        """Every page is free xor owned; the free stack has no duplicates."""
        if len(set(self.free)) != len(self.free):
            raise AssertionError(f"page on the free stack twice: {self.free}")
        for page, entry in enumerate(self.entries):
            if (page in self.free) == (entry.owner is not None):
                raise AssertionError(f"page {page} free={page in self.free} owner={entry.owner}")
