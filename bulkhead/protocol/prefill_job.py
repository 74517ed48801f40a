"""Prefill's decisions about one request (each function's docstring says
when, and its JobStep which effects), shared by the checker's prefill actor
(bulkhead.verify.actors.prefill) and the running prefill worker
(bulkhead.disagg.prefill_worker).

`runtime` (quiesced): the runtime's worker asks from any phase, and one with
no quiesced row raises IllegalTransition (the request fails closed); the
model asks only where it may drain.
"""
from __future__ import annotations

from bulkhead.protocol.lifecycle import Actor, Event, advance
from bulkhead.protocol.transitions import Effect, JobStep, transition
from bulkhead.protocol.types import Phase

PREFILL = Actor.PREFILL
_ENDED = (Phase.DRAINING, Phase.DONE)
_QUIESCE_FROM = (Phase.DRAINING, Phase.TRANSFERRING, Phase.WAITING_POOL)


@transition("prefill", outcomes=("new", "duplicate"), model_only={
    "joins_grant": "the runtime's decode grants pages only after prefill_ready, so no grant precedes a ticket"})
def assign(phase: Phase | None, has_ticket: bool) -> JobStep:
    """A verified ticket: a new record, or the one a grant that overtook
    the ticket made. A second ticket, or one after the outcome, is ignored."""
    if phase is None:
        return JobStep(advance(PREFILL, None, Event.ASSIGN), outcome="new")
    if has_ticket or phase in _ENDED:
        return JobStep(phase, outcome="duplicate")
    return JobStep(phase, outcome="joins_grant")


@transition("prefill", outcomes=("kept", "late"), model_only={
    "early": "the runtime's decode grants pages only after prefill_ready, so no grant precedes a ticket"})
def pages_granted(phase: Phase | None, has_grant: bool) -> JobStep:
    """Decode's grant is kept (once) until the KV is ready to write. Never
    after the outcome: no write is posted once the request has ended."""
    if phase is None:  # the grant overtook the ticket (the model's network reorders)
        return JobStep(advance(PREFILL, None, Event.PAGES_GRANTED), outcome="early")
    if has_grant or phase in _ENDED:
        return JobStep(phase, outcome="late")
    return JobStep(phase, outcome="kept")


@transition("prefill", outcomes=("prefilled", "finalized"))
def prefilled(phase: Phase | None) -> JobStep:
    """The engine hands the prompt's KV over, in prefill's own pages. After
    the outcome (the engine is not stopped mid-step) they go straight back:
    no write was posted."""
    if phase is Phase.WAITING_POOL:
        return JobStep(advance(PREFILL, phase, Event.PREFILLED), outcome="prefilled")
    return JobStep(phase, (Effect.RELEASE_LOCAL,), "finalized")


@transition("prefill", outcomes=("post", "not_ready"))
def start_transfer(phase: Phase | None, grant_matches: bool) -> JobStep:
    """Write only once the KV is computed and a grant for this very room,
    epoch and decode worker is in hand."""
    if phase is Phase.PREFILLING and grant_matches:
        return JobStep(advance(PREFILL, phase, Event.PAGES_GRANTED), (Effect.POST_WRITES,), "post")
    return JobStep(phase, outcome="not_ready")


@transition("prefill", outcomes=("draining", "repeat"))
def finalize(phase: Phase | None) -> JobStep:
    """The router's outcome: post nothing more. The drain ack waits until
    no write is outstanding (quiesced)."""
    if phase in _ENDED:
        return JobStep(phase, outcome="repeat")
    effects = (Effect.STOP_ENGINE,) if phase in (Phase.WAITING_POOL, Phase.PREFILLING) else ()
    return JobStep(advance(PREFILL, phase, Event.FINALIZE), effects, "draining")


@transition("prefill", outcomes=("acked", "moot"))
def quiesced(phase: Phase | None, *, runtime: bool = False) -> JobStep:
    """No write for the request is outstanding: free the local pages and
    tell decode it may free its own: after the outcome, as soon as the
    writes posted have ended (TRANSFERRING: the success path, which no
    Finalize follows), or for a prompt the engine ended (an error) before
    the hand-over (WAITING_POOL: nothing was written)."""
    if phase in (None, Phase.DONE) or (phase not in _QUIESCE_FROM and not runtime):
        return JobStep(phase, outcome="moot")
    return JobStep(advance(PREFILL, phase, Event.QUIESCED), (Effect.RELEASE_LOCAL, Effect.SEND_DRAIN_ACK), "acked")


@transition("prefill", outcomes=("unacked",))
def undrained(phase: Phase | None) -> JobStep:
    """The transfer failed with a write of it still in flight (a timeout):
    it may yet land, so the request is never acked and decode's lease
    fences it. Local pages go back (no write reads them any more)."""
    return JobStep(advance(PREFILL, phase, Event.UNDRAINED), (Effect.RELEASE_LOCAL,), "unacked")
