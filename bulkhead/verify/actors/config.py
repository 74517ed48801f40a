"""What a run of the model checker is configured with: the protocol
variant, the guards, the world's pools and rooms, and what each client
asks for. The runtime has none of these (its limits come from its engines,
its guards are one flag, --unsafe-no-guards).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, fields, replace


class Variant(enum.Enum):
    """REAL is bulkhead's protocol. LEGACY reproduces the incident's
    behaviour (per-side limits, a rejection kept as a pending flag on a live
    1-token stub, the router returning decode's 200 and dropping prefill's
    400). Run LEGACY with Guards.none()."""

    REAL = "real"
    LEGACY = "legacy"


@dataclass(frozen=True)
class Guards:
    """Each safety mechanism, individually switchable so a test can show the
    model checker finds a counterexample without it. Production runs all on."""

    # One decision at the router, against the smallest limit of the pair,
    # before any room, page or transfer. Off: the router bootstraps first and
    # rejects afterwards, as a late check would.
    admission_before_bootstrap: bool = True
    # Decode commits only if the manifest equals its allocation and every
    # allocated page was written in this epoch. Off: the sender's word counts.
    coverage_check: bool = True
    # Every landed payload's digest equals the manifest's digest for that page.
    digest_check: bool = True
    # A page a remote writer may still write is freed only after the writer's
    # drain ack (or a fenced lease expiry). Off: freed at finalize.
    drain_before_reuse: bool = True
    # A write whose (incarnation, owner, generation) no longer matches the
    # page ledger is refused when it is admitted.
    generation_check: bool = True
    # Freed pages (and the whole pool after a restart) are zeroed.
    scrub_on_free: bool = True
    # Control messages and tickets carry an HMAC; unsigned ones are dropped.
    hmac: bool = True

    @classmethod
    def none(cls) -> "Guards":
        return cls(**{f.name: False for f in fields(cls)})

    def without(self, name: str) -> "Guards":
        if name not in {f.name for f in fields(self)}:
            raise ValueError(f"unknown guard {name!r}")
        return replace(self, **{name: False})


@dataclass(frozen=True)
class RequestSpec:
    """What a client asks for. prompt_pages are written by prefill;
    decode_pages hold generated tokens and are written by decode itself."""

    rid: int
    tenant: str
    prompt_pages: int
    decode_pages: int
    prefill: int   # index of the prefill worker the router pairs it with
    decode: int    # index of the decode worker

    @property
    def total_pages(self) -> int:
        return self.prompt_pages + self.decode_pages

    @property
    def request_id(self) -> int:
        """The ticket's name for it (protocol.ticket), as the runtime's Admitted has."""
        return self.rid

@dataclass(frozen=True)
class ProtocolConfig:
    """Everything the step functions read but never change."""

    prefill_pools: tuple[int, ...]   # pages per prefill worker pool
    decode_pools: tuple[int, ...]    # pages per decode worker pool
    context_pages: int               # the model's advertised context, in pages
    rooms: int                       # bootstrap rooms the router can hand out
    guards: Guards = Guards()
    variant: Variant = Variant.REAL

    def __post_init__(self):
        if not self.prefill_pools or not self.decode_pools:
            raise ValueError("need at least one prefill and one decode pool")
        if self.rooms < 1:
            raise ValueError("need at least one bootstrap room")

    def admission_limit(self, spec: RequestSpec) -> tuple[str, int]:
        """The smallest limit of the pair, named, in pages."""
        limits = (("prefill_pool", self.prefill_pools[spec.prefill]),
                  ("decode_pool", self.decode_pools[spec.decode]),
                  ("context_length", self.context_pages))
        return min(limits, key=lambda item: item[1])
