"""Which prompt the scheduler prefills next: an ordering policy, chosen once.

The scheduler asks its order for the candidates of the next chunk and ranks
them with it; it never asks which order it has. Two orders exist:

    order                 | candidates                      | a chunk that does not fit
    ----------------------+---------------------------------+--------------------------
    LeastServedFirst      | per tenant: its oldest half-    | is passed over; long
    (the default, VTC)    | prefilled request, else (room   | passes are sliced so
                          | permitting) its first waiting   | others go ahead
                          | one; least service first        |
    FirstComeFirstServed  | the oldest half-prefilled       | stops the step's prefill:
    (measurement only:    | request, else the oldest        | nobody overtakes the head
    what fairness costs,  | waiting one                     | of the line; passes run
    `--fairness fcfs`)    |                                 | whole
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from bulkhead.engine.fair_queue import FairQueue
from bulkhead.engine.request import Request

# A prefill candidate: the request, and whether it is running (half-prefilled) already.
Candidate = tuple[Request, bool]


class PrefillOrder(ABC):
    """How the scheduler picks prefill chunks. Pure: reads requests, mutates nothing."""

    @abstractmethod
    def candidates(self, running: list[Request], waiting: FairQueue, planned: set[str], passed_over: set[str],
                   batch_has_room: bool) -> list[Candidate]:
        """Whom the step may prefill next. planned: request ids planned (or
        preempted, or in flight) this step; passed_over: ids whose chunk did
        not fit this step; batch_has_room: a waiting request may start."""

    @abstractmethod
    def rank(self, req: Request, running: bool, next_tokens: int) -> tuple:
        """Sort key of a candidate whose next chunk is next_tokens prompt tokens: least first."""

    @abstractmethod
    def slice_tokens(self, configured: int) -> int:
        """Tokens of a whole pass one slice of layers costs (pass_slices.py); 0 = passes run whole."""


class LeastServedFirst(PrefillOrder):
    """Fair across tenants (bulkhead.engine.fair_queue: virtual token counters)."""

    def __init__(self, queue: FairQueue):
        self.queue = queue

    def candidates(self, running: list[Request], waiting: FairQueue, planned: set[str], passed_over: set[str],
                   batch_has_room: bool) -> list[Candidate]:
        skip = planned | passed_over
        partial: dict[str, Request] = {}  # per tenant: its oldest half-prefilled request
        for r in running:
            if r.num_computed < r.prefill_target and r.request_id not in skip:
                if r.tenant not in partial or r.arrival < partial[r.tenant].arrival:
                    partial[r.tenant] = r
        out = [(r, True) for r in partial.values()]
        if batch_has_room:
            out += [(r, False) for r in waiting.heads() if r.tenant not in partial and r.request_id not in skip]
        return out

    def rank(self, req: Request, running: bool, next_tokens: int) -> tuple:
        """The tenant's service after the chunk (a finish tag, as weighted fair
        queueing), not before: a newly active tenant is lifted exactly level
        with the busiest, and on start tags the older arrival (the flood's
        half-done prompt) would win the tie, the short prompt waiting a whole chunk more."""
        return self.queue.finish_tag(req.tenant, next_tokens), req.arrival

    def slice_tokens(self, configured: int) -> int:
        return configured


class FirstComeFirstServed(PrefillOrder):
    """Kept so that benchmarks (bench/noisy_neighbour.py) can measure what
    fair queueing costs and buys; no scheduling function branches on it."""

    def candidates(self, running: list[Request], waiting: FairQueue, planned: set[str], passed_over: set[str],
                   batch_has_room: bool) -> list[Candidate]:
        if passed_over:  # the head of the line did not fit: nobody behind it goes first
            return []
        started = [r for r in running if r.num_computed < r.prefill_target and r.request_id not in planned]
        if started:
            return [(min(started, key=lambda r: r.arrival), True)]
        if batch_has_room:
            return [(r, False) for r in waiting if r.request_id not in planned][:1]
        return []

    def rank(self, req: Request, running: bool, next_tokens: int) -> tuple:
        return (not running), req.arrival

    def slice_tokens(self, configured: int) -> int:
        return 0  # a slice lets another tenant ahead of the pass
