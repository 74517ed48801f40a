"""What one simulated run shares: the virtual loop, the seeded RNG, the fault
plan, fault counts, the trace and what the invariant checks read afterwards."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from bulkhead.sim.faults import FaultPlan
from bulkhead.sim.loop import VirtualLoop

START_S = 1000.0  # virtual time at boot; any value works, none is a wall-clock reading


@dataclass
class Violation:
    kind: str
    detail: str
    at: float

    def __str__(self) -> str:
        return f"{self.kind} at t={self.at:.4f}: {self.detail}"


@dataclass
class SimContext:
    seed: int
    plan: FaultPlan
    honour_write_guard: bool = True  # False: the ablation (a backend that never asks decode's guard)
    tracing: bool = False
    loop: VirtualLoop = field(default_factory=lambda: VirtualLoop(START_S))
    fired: Counter = field(default_factory=Counter)  # fault kind -> times it changed what happened
    stats: Counter = field(default_factory=Counter)  # everything else worth counting
    trace: list[str] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    sent: list[tuple[float, str, str, dict]] = field(default_factory=list)  # (t, from, to, message)
    delivered: list[tuple[float, str, dict]] = field(default_factory=list)  # (t, to, message) accepted
    bad_reads: list[tuple] = field(default_factory=list)  # (t, worker, canary, position, K seen, V seen)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def now(self) -> float:
        return self.loop.now

    def after(self, delay: float, fn, *args):
        return self.loop.call_at(self.loop.now + delay, fn, *args)

    def log(self, text: str) -> None:
        if self.tracing:
            self.trace.append(f"{self.loop.now - START_S:9.4f}  {text}")

    def fire(self, kind: str, detail: str) -> None:
        self.fired[kind] += 1
        self.log(f"FAULT {kind}: {detail}")

    def violation(self, kind: str, detail: str) -> None:
        self.violations.append(Violation(kind, detail, self.loop.now - START_S))
        self.log(f"VIOLATION {kind}: {detail}")
