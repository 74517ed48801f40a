"""Exact coverage (invariant 3): the transfer manifest against decode's allocation. Pure.

The checker's decode actor and the running decode worker share
`write_admissible` and the manifest checks `identity_problems` and
`mismatched_pages` (the worker through `coverage_problems`). Not shared: the
runtime's check that the granted pages' generations and owners are unchanged at commit
(the model checks generations per write instead) and the model's wait for
in-flight landings.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Allocation:
    """What decode granted for one request."""

    request_id: str
    tenant: str
    room: int
    epoch: int
    token_count: int
    pages: tuple[int, ...]
    generations: tuple[int, ...]


@dataclass(frozen=True)
class Manifest:
    """What prefill says it wrote."""

    request_id: str
    tenant: str
    room: int
    epoch: int
    prefix_len: int  # tokens reused from prefill's prefix cache (still transferred)
    token_count: int
    pages: tuple[int, ...]
    generations: tuple[int, ...]
    digests: tuple[int, ...]  # one per page, xxh3_64 over the page bytes

    def to_dict(self) -> dict:
        return asdict(self)

    def digest(self) -> str:
        """SHA-256 of the manifest's fields (canonical JSON), the same on both
        sides: the lineage logs of prefill and decode join on it."""
        body = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(body).hexdigest()

    @classmethod
    def from_dict(cls, d: dict) -> Manifest:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


# The fields a manifest must repeat exactly, in the order problems are reported.
IDENTITY_FIELDS = ("request_id", "tenant", "room", "epoch", "token_count", "pages", "generations")


def identity_problems(alloc: Allocation, manifest: Manifest) -> list[str]:
    """Where the manifest does not describe exactly this allocation: another
    request, tenant, room or epoch, or other pages, counts or generations."""
    return [f"{name}: allocated {getattr(alloc, name)!r}, manifest {getattr(manifest, name)!r}"
            for name in IDENTITY_FIELDS if getattr(alloc, name) != getattr(manifest, name)]


def mismatched_pages(pages, local_digests, claimed_digests) -> list[int]:
    """Pages whose bytes here do not hash to what the writer says it sent.
    A local digest of None (the model: nothing landed yet) is not compared."""
    return [p for p, mine, theirs in zip(pages, local_digests, claimed_digests)
            if mine is not None and mine != theirs]


def coverage_problems(alloc: Allocation, manifest: Manifest, current_generations: tuple[int, ...],
                      local_digests: tuple[int, ...]) -> list[str]:
    """Every reason not to commit; empty means decode may mark the KV ready.

    current_generations: the ledger's generation of each allocated page now
    (a page that moved on since the grant must not be committed).
    local_digests: digests decode computed over its own pool pages.
    """
    problems = identity_problems(alloc, manifest)
    if tuple(current_generations) != alloc.generations:
        problems.append("a page changed generation since it was granted")
    if len(manifest.digests) != len(alloc.pages):
        problems.append(f"{len(manifest.digests)} digests for {len(alloc.pages)} pages")
    elif bad := mismatched_pages(alloc.pages, local_digests, manifest.digests):
        problems.append(f"digest mismatch on pages {bad}")
    return problems


def write_admissible(writer: tuple, page_now: tuple, awaiting_kv: bool) -> bool:
    """May a remote write land on a page? Only while the page is still what
    the writer was granted (its owner and generation, and in the model the
    process incarnation: `writer` and `page_now` in the same order), and only
    while the request still waits for its KV: a late or duplicated write
    after commit or failure would otherwise pass the owner and generation
    check (found by the TLA+ model, specs/)."""
    return awaiting_kv and writer == page_now
