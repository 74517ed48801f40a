"""The admission ticket: the router's one decision about one request, bound
to the room and epoch it was bootstrapped in. One type for the runtime and
the model checker; signing is a wrapper around it (the runtime's MAC is an
HMAC under the cluster key, bulkhead.disagg.ticket; the model's a stand-in,
verify.actors.values.MODEL_MAC).

`admitted` is the decision itself: the runtime's `engine.admission.Admitted`
or the model's `RequestSpec`, each with `request_id` and `tenant`. Workers
verify the MAC, then re-check the ticket against their own limits; they
never decide admission again.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ticket:
    admitted: Any                   # Admitted (runtime) or RequestSpec (model): see above
    room: int
    epoch: int
    # The tenant's share as the router's tenant table had it at admission:
    # the workers' fair queues and KV quotas read it (runtime; the model has
    # no scheduler and leaves the defaults).
    weight: float = 1.0             # fair-share weight (> 0)
    kv_share: float | None = None   # KV pool fraction; None = the fair share of active tenants
    # The workers' incarnations as the router knew them (model): a ticket
    # that outlived a restart is ignored. The runtime's router does not bind
    # a ticket to them; a worker that restarts re-registers and the router
    # fails its old routes instead (disagg/router.py _register).
    prefill_incarnation: int = 1
    decode_incarnation: int = 1

    @property
    def request_id(self):
        return self.admitted.request_id

    @property
    def tenant(self) -> str:
        return self.admitted.tenant


@dataclass(frozen=True)
class SignedTicket:
    """A ticket and its MAC. Only the router, which holds the key, makes one
    that verifies; a worker takes the ticket out only after verifying it."""

    ticket: Ticket
    mac: str

    @property
    def request_id(self):
        return self.ticket.request_id

