"""Decode's decisions about one request (each function's docstring says
when, and its JobStep which effects), shared by the checker's decode actor
(bulkhead.verify.actors.decode) and the running decode worker
(bulkhead.disagg.decode_worker)."""
from __future__ import annotations

from collections.abc import Callable

from bulkhead.protocol.lifecycle import Actor, Event, advance
from bulkhead.protocol.transitions import Effect, JobStep, transition
from bulkhead.protocol.types import Phase

DECODE = Actor.DECODE

# The verdict's "not yet": some page of the allocation has not landed.
WAIT = "wait"


@transition("decode", outcomes=("new", "duplicate"))
def assign(phase: Phase | None) -> JobStep:
    """A verified ticket. A second one for a known request is a duplicate."""
    if phase is not None:
        return JobStep(phase, outcome="duplicate")
    return JobStep(advance(DECODE, None, Event.ASSIGN), outcome="new")


@transition("decode", outcomes=("reserve", "not_waiting"))
def wants_pages(phase: Phase | None) -> JobStep:
    """Only a request waiting for pages asks the pool for them."""
    if phase is Phase.WAITING_PAGES:
        return JobStep(phase, (Effect.RESERVE_PAGES,), "reserve")
    return JobStep(phase, outcome="not_waiting")


@transition("decode", outcomes=("granted", "unwanted"))
def pages_reserved(phase: Phase | None) -> JobStep:
    """The pool handed over the request's pages. Granted (and told to the
    writer) only while the request still waits for them; otherwise the
    outcome came while the runtime's reservation was in flight, and the
    pages go straight back (no writer was ever told of them)."""
    if phase is Phase.WAITING_PAGES:
        return JobStep(advance(DECODE, phase, Event.PAGES_GRANTED), (Effect.GRANT_PAGES,), "granted")
    return JobStep(phase, (Effect.RETURN_PAGES,), "unwanted")


@transition("decode", outcomes=("check", "unexpected"))
def manifest_arrived(phase: Phase | None, has_manifest: bool) -> JobStep:
    """Prefill's manifest is checked once, and only while the pages wait
    for their KV; a late or repeated one is counted and ignored."""
    if phase is Phase.DECODE_ALLOCATED and not has_manifest:
        return JobStep(phase, (Effect.CHECK_KV,), "check")
    return JobStep(phase, outcome="unexpected")


@transition("decode", outcomes=("moot", "failed", "commit"), model_only={
    "wait": "the runtime checks once, after prefill's writes have returned (TransferDone follows them); "
            "the model's writes land in any order around the manifest"})
def verdict(phase: Phase | None, check: Callable[[], str]) -> JobStep:
    """The checks' result: check() returns "" to commit, WAIT to wait for
    more landings, or why the KV is refused; it runs only while the request
    can still commit (not once it has failed or moved on, say finalized
    while the check ran). A refusal drains at once (TransferFailed to the
    router, whose Finalize then changes nothing here): the pages go at
    prefill's ack, or the lease."""
    if phase is not Phase.DECODE_ALLOCATED:
        return JobStep(phase, outcome="moot")
    problems = check()
    if problems == WAIT:
        return JobStep(phase, outcome="wait")
    if problems:
        return JobStep(advance(DECODE, phase, Event.VERIFY_FAILED), (Effect.MARK_FAILED,), "failed", problems)
    return JobStep(advance(DECODE, phase, Event.MANIFEST_VERIFIED), (Effect.COMMIT,), "commit")


@transition("decode", outcomes=("step", "moot"))
def decode_step(phase: Phase | None) -> JobStep:
    """The first step on committed KV tells the router (the model's one
    Output); later steps change no phase (the model's read the pages again)."""
    if phase is not Phase.COMMITTED:
        return JobStep(phase, outcome="moot")
    return JobStep(advance(DECODE, phase, Event.DECODE_STEP), (Effect.DECODE_DONE,), "step")


@transition("decode", outcomes=("repeat", "released", "draining", "abort"))
def finalize(phase: Phase | None, drained: bool, *, drain_guard: bool = True) -> JobStep:
    """The router's outcome. Pages a writer may still reach wait for the
    drain ack (or the lease); with the ack already in, or with nothing
    held, they are freed now. Guard off (drain_before_reuse), the ack is
    not waited for: the ablation that shows it unsafe. A committed request
    is the engine's to end (abort): not a phase change here; its last
    output is `finished`, which frees the pages (no write is admitted after
    the commit)."""
    if phase in (Phase.DRAINING, Phase.DONE):
        return JobStep(phase, outcome="repeat")
    if phase in (Phase.COMMITTED, Phase.DECODING):
        return JobStep(phase, (Effect.ABORT_ENGINE,), "abort")
    after = advance(DECODE, phase, Event.FINALIZE)
    if after is Phase.DRAINING and (drained or not drain_guard):
        after = advance(DECODE, after, Event.DRAIN_ACK)
    if after is Phase.DONE:
        return JobStep(after, (Effect.RELEASE_PAGES,), "released")
    return JobStep(after, (Effect.START_LEASE,), "draining")


@transition("decode", outcomes=("late", "released", "early"))
def drain_ack(phase: Phase | None) -> JobStep:
    """Prefill's ack: no write of its can still land. Frees a draining
    request's pages; before the outcome it is remembered."""
    if phase in (None, Phase.DONE):
        return JobStep(phase, outcome="late")
    if phase is Phase.DRAINING:
        return JobStep(advance(DECODE, phase, Event.DRAIN_ACK), (Effect.RELEASE_PAGES,), "released")
    return JobStep(phase, (Effect.MARK_DRAINED,), "early")


@transition("decode", outcomes=("released", "moot"))
def lease_expired(phase: Phase | None) -> JobStep:
    """The fence: no admitted write outlives the lease, so the pages go. A
    timer that fires after the ack freed them changes nothing (the runtime's
    tick lists expired leases before it takes each job's lock, so an ack can
    come between; the model fires a late timer at a finished record)."""
    if phase is not Phase.DRAINING:
        return JobStep(phase, outcome="moot")
    return JobStep(advance(DECODE, phase, Event.LEASE_EXPIRED), (Effect.RELEASE_PAGES,), "released")


@transition("decode", outcomes=("finished",))
def finished(phase: Phase | None) -> JobStep:
    """The last token: the request is over and its pages go, without a
    Finalize (the router sends none after a success) and without waiting
    for prefill's ack (no write is admitted after the commit). The
    runtime's engine frees the pages itself as it emits the last token;
    the model's decode scrubs and frees them here."""
    if phase is Phase.COMMITTED:  # one output can be the first and the last
        phase = advance(DECODE, phase, Event.DECODE_STEP)
    return JobStep(advance(DECODE, phase, Event.FINISHED), (Effect.RELEASE_PAGES,), "finished")
