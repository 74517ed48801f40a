"""The two enums every actor of the transfer protocol shares with the
runtime: where a request is (Phase) and how it ended (Outcome). Members
hash by identity, so a protocol state is cheap to hash (the model checker
stores millions of them), and serialize by value (the runtime's wire).
"""
from __future__ import annotations

import enum


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


class Phase(enum.Enum):
    """Where a request is, as one actor sees it (lifecycle.py holds every
    transition between them)."""

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

