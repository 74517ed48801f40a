"""Exact coverage (invariant 3): the transfer manifest against decode's allocation. Pure."""

from __future__ import annotations

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

    @classmethod
    def from_dict(cls, d: dict) -> Manifest:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def coverage_problems(
    alloc: Allocation, manifest: Manifest, current_generations: tuple[int, ...], local_digests: tuple[int, ...]
) -> list[str]:
    """Every reason not to commit; empty means decode may mark the KV ready.

    current_generations: the ledger's generation of each allocated page now
    (a page that moved on since the grant must not be committed).
    local_digests: digests decode computed over its own pool pages.
    """
    problems = []
    for name in ("request_id", "tenant", "room", "epoch", "token_count", "pages", "generations"):
        if getattr(alloc, name) != getattr(manifest, name):
            problems.append(f"{name}: allocated {getattr(alloc, name)!r}, manifest {getattr(manifest, name)!r}")
    if tuple(current_generations) != alloc.generations:
        problems.append("a page changed generation since it was granted")
    if len(manifest.digests) != len(alloc.pages):
        problems.append(f"{len(manifest.digests)} digests for {len(alloc.pages)} pages")
    else:
        bad = [p for p, mine, theirs in zip(alloc.pages, local_digests, manifest.digests) if mine != theirs]
        if bad:
            problems.append(f"digest mismatch on pages {bad}")
    return problems
