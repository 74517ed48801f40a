"""The simulator's fault kinds and the per-seed plan that decides how often each may strike.

Each seed draws its own plan: every kind is switched on with some probability
and given a rate, so across seeds there are quiet runs, single-fault runs and
storms. A fault is counted when it changed what happened (a message really
lost, a write really late), never merely for being armed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FAULT_KINDS = (
    "delay",         # a control message takes 50 ms to 1 s (and holds up its channel, as TCP would)
    "drop",          # a control message is lost (nothing retransmits: deadlines must end the request)
    "duplicate",     # a control message arrives twice (the replay check must drop the copy)
    "reorder",       # a control message is overtaken by a later one on its channel
    "crash",         # a worker dies (state and pool gone) and restarts under a new incarnation
    "slow_writer",   # a KV write times out at the writer (not drained) and lands later
    "stale_handle",  # a KV write is delivered again much later, with the generations it was granted
    "client_abort",  # the client goes away mid-request
)


@dataclass(frozen=True)
class FaultPlan:
    """Per-event probabilities (0 = off) and crash times for one seed."""

    delay: float = 0.0
    drop: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    crashes: tuple[tuple[float, str, float], ...] = ()  # (at s after boot, worker, down for s)
    slow_writer: float = 0.0
    stale_handle: float = 0.0
    client_abort: float = 0.0

    @classmethod
    def draw(cls, rng: random.Random, workers: tuple[str, ...]) -> FaultPlan:
        def maybe(p_on: float, lo: float, hi: float) -> float:
            return rng.uniform(lo, hi) if rng.random() < p_on else 0.0

        crashes = ()
        if rng.random() < 0.3:
            crashes = ((rng.uniform(0.3, 2.0), rng.choice(workers), rng.uniform(0.2, 4.0)),)
        return cls(
            delay=maybe(0.4, 0.02, 0.2), drop=maybe(0.3, 0.01, 0.06), duplicate=maybe(0.4, 0.02, 0.15),
            reorder=maybe(0.4, 0.02, 0.2), crashes=crashes, slow_writer=maybe(0.35, 0.2, 0.7),
            stale_handle=maybe(0.35, 0.2, 0.7), client_abort=maybe(0.3, 0.1, 0.4),
        )

    def describe(self) -> str:
        parts = [f"{k}={getattr(self, k):.2f}" for k in ("delay", "drop", "duplicate", "reorder", "slow_writer",
                                                          "stale_handle", "client_abort") if getattr(self, k)]
        parts += [f"crash {w} at +{t:.2f}s for {d:.2f}s" for t, w, d in self.crashes]
        return ", ".join(parts) or "no faults"
