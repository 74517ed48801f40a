"""The router's decisions about one request (each function's docstring says
when, and its JobStep which effects), shared by the checker's router actor
(bulkhead.verify.actors.router) and the running router (bulkhead.disagg.router)."""
from __future__ import annotations

from bulkhead.protocol.lifecycle import Actor, Event, advance
from bulkhead.protocol.transitions import Effect, JobStep, transition
from bulkhead.protocol.types import Phase

ROUTER = Actor.ROUTER


@transition("router", outcomes=("admitted",), model_only={
    "rejected": "the runtime's API rejects before the router (engine/admission.py admit(), one decision "
                "against the pair's smallest limit): a rejection never reaches it"})
def submit(rejection: str) -> JobStep:
    """rejection: '' if the request fits the smallest limit of its pair,
    else why not; a rejection is the client's answer and nothing else."""
    if rejection:
        return JobStep(advance(ROUTER, None, Event.REJECT), (Effect.RESPOND,), "rejected", rejection)
    return JobStep(advance(ROUTER, None, Event.ADMIT), outcome="admitted")


@transition("router", outcomes=("bootstrapped", "held"))
def bootstrap(phase: Phase | None, pair_draining: bool = False) -> JobStep:
    """Assign the request to its pair, unless a worker of the pair is
    draining: then it is held (the model's request waits for its deadline;
    the runtime's router answers 503 for the client to retry, as for a pair
    lost since it was chosen)."""
    if pair_draining:
        return JobStep(phase, outcome="held")
    return JobStep(advance(ROUTER, phase, Event.BOOTSTRAP), (Effect.ASSIGN_BOTH,), "bootstrapped")


@transition("router", outcomes=("draining", "repeat"))
def drain_worker(already_draining: bool) -> JobStep:
    """Not a request's step: the worker leaves the set bootstrap assigns to."""
    return JobStep(None, outcome="repeat" if already_draining else "draining")


@transition("router", outcomes=("finalized", "repeat"), model_only={
    "unassigned": "the runtime's router bootstraps at admission (its rooms never run out), so no request "
                  "waits for a room"})
def decide(phase: Phase | None) -> JobStep:
    """The request's one outcome. The first decision wins; a later report,
    abort or deadline changes nothing. Workers of a bootstrapped request
    hear the outcome before the client does."""
    if phase in (None, Phase.DONE):
        return JobStep(phase, outcome="repeat")
    after = advance(ROUTER, phase, Event.FINALIZE)
    if phase is Phase.BOOTSTRAPPED:
        return JobStep(after, (Effect.FINALIZE_WORKERS, Effect.RESPOND), "finalized")
    return JobStep(after, (Effect.RESPOND,), "unassigned")


@transition("router", outcomes=("finished", "repeat"))
def finished(phase: Phase | None) -> JobStep:
    """Decode's last output (its tokens, or its typed error) is the outcome.
    The workers are not finalized: decode freed its pages with the last
    token and prefill acks as its writes end. After a decision (an abort
    that overtook the output; in the runtime also the error output of a
    failure the router answered first) it changes nothing."""
    if phase in (None, Phase.DONE):
        return JobStep(phase, outcome="repeat")
    return JobStep(advance(ROUTER, phase, Event.FINALIZE), (Effect.RESPOND,), "finished")
