"""The model's small values: actor addresses, page contents, the stand-in
MAC, and the helpers its states are built with (a cached hash; rid-sorted
tuples of records). The runtime has its own of each: socket identities,
the KV bytes and their xxh3 digests, an HMAC under the cluster key.
"""
from __future__ import annotations

from dataclasses import fields, replace


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


# The model's MAC: what only the router, which holds the key, puts on a
# ticket (an attacker's ticket carries another). The runtime's is an HMAC
# under the cluster key (bulkhead.disagg.ticket).
MODEL_MAC = "router"


def find(records: tuple, rid: int):
    """The record for rid in a rid-sorted tuple of records, or None."""
    return next((record for record in records if record.rid == rid), None)


def upsert(records: tuple, record) -> tuple:
    """records with `record` replacing the one of the same rid (or added),
    kept sorted by rid so equal states hash equal."""
    return tuple(sorted([r for r in records if r.rid != record.rid] + [record], key=lambda r: r.rid))


def put(state, record):
    """state with `record` upserted into its requests."""
    return replace(state, requests=upsert(state.requests, record))
