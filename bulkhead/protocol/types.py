"""Values shared by every actor of the transfer protocol: ids, outcomes,
guards and request specs. The transfer manifest (protocol.manifest) and the
admission ticket (protocol.ticket) are the runtime's own: one type each.

Everything here is a frozen dataclass or an enum over ints and strings, so a
protocol state is hashable (the model checker stores millions of them) and
serializable (the runtime puts the same values on the wire).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, fields

def cached_hash(cls):
    """For frozen dataclasses hashed again and again (the model checker's
    state table): compute the field hash once per object, not per lookup."""
    names = tuple(f.name for f in fields(cls))

    def __hash__(self) -> int:
        try:
            return self.__dict__["_cached_hash"]
        except KeyError:
            value = hash(tuple(getattr(self, name) for name in names))
            object.__setattr__(self, "_cached_hash", value)
            return value

    cls.__hash__ = __hash__
    return cls


# Actor addresses. Plain tuples so messages stay cheap to hash.
ROUTER = ("router", 0)


def prefill_addr(index: int) -> tuple[str, int]:
    return ("prefill", index)


def decode_addr(index: int) -> tuple[str, int]:
    return ("decode", index)


class Outcome(enum.Enum):
    """The one terminal outcome of a request. The router decides it; prefill
    and decode only record what the router told them (a Finalize message), so
    all three see the same value."""

    FINISHED = "finished"            # 200 with tokens built on verified KV
    REJECTED = "rejected"            # 4xx at admission; nothing was allocated
    ABORTED = "aborted"              # the client went away
    TIMED_OUT = "timed_out"          # the router's deadline passed
    TRANSFER_FAILED = "transfer_failed"  # decode could not verify the KV
    PEER_LOST = "peer_lost"          # a worker holding the request restarted
    PREFILL_FAILED = "prefill_failed"  # prefill could not compute the prompt (runtime; LEGACY's 400)

    def __repr__(self) -> str:  # short in traces
        return self.name

    __hash__ = object.__hash__  # identity: members are singletons (and it is fast)


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
        return _replace(self, **{name: False})

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def _replace(obj, **changes):
    from dataclasses import replace

    return replace(obj, **changes)


@dataclass(frozen=True)
class PoolLimits:
    """What one worker can hold, in pages. Sizes are in pages so the model
    stays small; the runtime multiplies by its page size."""

    pool_pages: int


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


# Page contents as the model sees them: ZERO (scrubbed) or the origin of the
# KV held, (rid, epoch), or GARBAGE (a payload corrupted on the wire).
ZERO = None
GARBAGE = ("garbage",)


def kv_origin(rid: int, epoch: int) -> tuple[int, int]:
    return (rid, epoch)


def digest_of(content) -> int | None:
    """Stand-in for a real page digest (xxhash over the KV bytes): equal
    contents give equal digests, different contents different ones."""
    return hash(("digest", content))


class Phase(enum.Enum):
    """Where a request is, as one actor sees it (see protocol.py's table;
    lifecycle.py holds every transition between them)."""

    ADMITTED = "admitted"                  # router: passed admission, no room yet
    BOOTSTRAPPED = "bootstrapped"          # router: room assigned, pair told
    WAITING_POOL = "waiting_pool"          # prefill: ticket held, no local pages yet
    PREFILLING = "prefilling"              # prefill: local pages held, KV computed
    TRANSFERRING = "transferring"          # prefill: writes posted, manifest sent
    WAITING_PAGES = "waiting_pages"        # decode: ticket held, pool full
    DECODE_ALLOCATED = "decode_allocated"  # decode: pages granted, awaiting KV
    COMMITTED = "committed"                # decode: manifest verified, KV ready
    DECODING = "decoding"                  # decode: tokens generated, told router
    DRAINING = "draining"                  # worker: outcome known, writes may be in flight
    DONE = "done"                          # terminal: outcome recorded, resources released

    def __repr__(self) -> str:
        return self.name

    __hash__ = object.__hash__


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


def find(records: tuple, rid: int):
    """The record for rid in a rid-sorted tuple of records, or None."""
    for record in records:
        if record.rid == rid:
            return record
    return None


def upsert(records: tuple, record) -> tuple:
    """records with `record` replacing the one of the same rid (or added),
    kept sorted by rid so equal states hash equal."""
    kept = [r for r in records if r.rid != record.rid]
    kept.append(record)
    kept.sort(key=lambda r: r.rid)
    return tuple(kept)
