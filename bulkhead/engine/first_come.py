"""First come, first served across tenants: measurement only (`--fairness fcfs`).

Kept so that benchmarks (bench/noisy_neighbour.py) can measure what fair
queueing costs and buys. The scheduler reaches it only through the
PrefillOrder it is given at construction (prefill_order.py); no scheduling
function branches on it.
"""

from __future__ import annotations

from bulkhead.engine.fair_queue import FairQueue
from bulkhead.engine.prefill_order import Candidate, PrefillOrder
from bulkhead.engine.request import Request


class FirstComeFirstServed(PrefillOrder):
    """The oldest half-prefilled request, else the oldest waiting one; nobody
    overtakes the head of the line, so a chunk that does not fit ends the
    step's prefill and passes run whole."""

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
