"""The per-request transition functions' common parts (router_job.py,
prefill_job.py, decode_job.py call `transition`):

    a transition: (phase, facts) -> JobStep(phase, effects, outcome)

The caller only carries out the effects: the model on its ledger and
network, the runtime on its engine and link. Each function declares every
outcome (branch) it may take; one only the model takes is declared with
why. The runtime has no outcome of its own: every outcome it may take is
one the search must explore. Every call is counted by outcome (`calls`),
so `bulkhead verify` can say, for each runtime handler, which of its
outcomes the search explored.
"""
from __future__ import annotations

import enum
import functools
from collections import Counter
from dataclasses import dataclass

from bulkhead.protocol.types import Phase


class Effect(enum.Enum):
    """What the caller must do after a transition. Each actor takes some."""

    # router
    ASSIGN_BOTH = "assign_both"              # the signed ticket to both workers of the pair
    FINALIZE_WORKERS = "finalize_workers"    # the outcome to both workers of the pair
    RESPOND = "respond"                      # the client gets its one answer
    # prefill
    STOP_ENGINE = "stop_engine"              # abort the prompt's computation, if it still runs
    POST_WRITES = "post_writes"              # write the KV into the granted pages, then TransferDone
    SEND_DRAIN_ACK = "send_drain_ack"        # no write of ours can still land
    RELEASE_LOCAL = "release_local"          # free prefill's own pages
    # decode
    RESERVE_PAGES = "reserve_pages"          # ask the pool for the request's pages
    GRANT_PAGES = "grant_pages"              # PagesGranted(pages, generations) to prefill
    RETURN_PAGES = "return_pages"            # a reservation nobody wants any more: straight back
    CHECK_KV = "check_kv"                    # run the manifest and digest checks
    COMMIT = "commit"                        # the KV is verified: decode may read it
    MARK_FAILED = "mark_failed"              # give up on the KV (TransferFailed to the router)
    MARK_DRAINED = "mark_drained"            # prefill's ack came before the outcome
    START_LEASE = "start_lease"              # no ack yet: the lease fences the writer
    RELEASE_PAGES = "release_pages"          # scrub and free the request's pages
    DECODE_DONE = "decode_done"              # tokens were generated and sent on
    ABORT_ENGINE = "abort_engine"            # the engine ends a committed request (its pages with it)

    __hash__ = object.__hash__


@dataclass(frozen=True)
class JobStep:
    """One transition's result. phase: the request's phase afterwards
    (unchanged when the step did nothing); outcome: which branch was taken,
    for logs, tests and the coverage report."""

    phase: Phase | None
    effects: tuple[Effect, ...] = ()
    outcome: str = ""
    detail: str = ""  # why, where the step refuses something (a failed check's reasons)

    def does(self, effect: Effect) -> bool:
        return effect in self.effects


@dataclass(frozen=True)
class TransitionInfo:
    name: str                      # "decode.finalize"
    outcomes: tuple[str, ...]      # every branch it may take
    model_only: dict               # outcome -> why the runtime never takes it


REGISTRY: dict[str, TransitionInfo] = {}
calls: Counter = Counter()  # ("decode.finalize", outcome) -> times taken, in this process


def transition(actor: str, outcomes: tuple[str, ...], model_only: dict | None = None):
    """Register a transition function with every outcome it may return, and
    count each call by outcome. outcomes: those both take; model_only:
    those only the model takes, with why."""
    model_only = model_only or {}

    def wrap(fn):
        name = f"{actor}.{fn.__name__}"
        REGISTRY[name] = TransitionInfo(name, tuple(outcomes) + tuple(model_only), model_only)
        declared = set(REGISTRY[name].outcomes)

        @functools.wraps(fn)
        def counted(*args, **kwargs):
            step = fn(*args, **kwargs)
            if step.outcome not in declared:  # a branch the coverage report would not know
                raise AssertionError(f"{name} returned undeclared outcome {step.outcome!r}")
            calls[(name, step.outcome)] += 1
            return step

        return counted
    return wrap


def explored() -> set[tuple[str, str]]:
    """(function, outcome) pairs taken in this process so far."""
    return set(calls)
