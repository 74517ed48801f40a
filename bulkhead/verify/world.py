"""The bounded world the model checker explores: which requests exist, the
pools and limits, and how many faults the environment may inject.

Bounds are small on purpose: every hazard in the incident class needs two
requests of different tenants sharing one decode pool, one request too long
for its prefill pool, and one or two faults. Larger bounds are a flag away.
"""
from __future__ import annotations

from dataclasses import dataclass

from bulkhead.verify.actors.config import Guards, ProtocolConfig, RequestSpec, Variant


@dataclass(frozen=True)
class World:
    name: str
    requests: tuple[RequestSpec, ...]
    prefill_pools: tuple[int, ...]   # pages; asymmetric on purpose (the incident)
    decode_pools: tuple[int, ...]
    context_pages: int
    rooms: int                       # fewer rooms than requests: rooms get reused
    # Faults the environment may inject in one run, in total: a client abort,
    # a worker crash-and-restart, a lost, duplicated or corrupted write, a
    # forged control message, a transfer that fails with a write in flight,
    # a prompt whose computation fails at prefill.
    # Reordering, delay and deadlines are free.
    faults: int = 1
    fault_kinds: frozenset = frozenset({"abort", "crash", "duplicate", "lose", "corrupt", "forge", "fail_write",
                                        "fail_prompt"})
    # Workers the operator may drain in one run (any worker, at any moment;
    # the last of its role too: the runtime refuses that only unless forced).
    drains: int = 0

    def protocol(self, guards: Guards = Guards(), variant: Variant = Variant.REAL) -> ProtocolConfig:
        return ProtocolConfig(self.prefill_pools, self.decode_pools, self.context_pages,
                              self.rooms, guards, variant)

    def describe(self) -> str:
        reqs = ", ".join(f"r{r.rid}:{r.tenant} {r.prompt_pages}+{r.decode_pages}p "
                         f"P{r.prefill}->D{r.decode}" for r in self.requests)
        return (f"{self.name}: [{reqs}] prefill pools {self.prefill_pools} decode pools "
                f"{self.decode_pools} context {self.context_pages} rooms {self.rooms} "
                f"faults {self.faults}" + (f" drains {self.drains}" if self.drains else ""))


# r0 (tenant A) and r1 (tenant B) share decode pool D0: every reuse hazard
# needs a page to pass between tenants. r2 (tenant A) asks 3 pages through
# prefill P1, whose pool holds 2: the incident's over-long request.
_R0 = RequestSpec(0, "A", prompt_pages=1, decode_pages=1, prefill=0, decode=0)
_R1 = RequestSpec(1, "B", prompt_pages=1, decode_pages=1, prefill=1, decode=0)
_R2 = RequestSpec(2, "A", prompt_pages=2, decode_pages=1, prefill=1, decode=0)
# r3 uses the second decode pool; only the large bound carries it.
_R3 = RequestSpec(3, "B", prompt_pages=2, decode_pages=1, prefill=0, decode=1)

POOLS = dict(prefill_pools=(4, 2), decode_pools=(4, 6), context_pages=8, rooms=2)


def default_world() -> World:
    return World("default", (_R0, _R1, _R2), **POOLS)


def small_world() -> World:
    """Fast enough for a guard-ablation test: two requests, one fault."""
    return World("small", (_R0, _R1), **POOLS)


def large_world() -> World:
    """Four requests over both decode pools and two faults: minutes, not CI."""
    return World("large", (_R0, _R1, _R2, _R3), **POOLS, faults=2)


def drain_world() -> World:
    """The small world with two drains (of any worker, at any moment, the
    same one twice too) and no other fault: assignments to a draining worker
    stop, what it holds finishes (seconds)."""
    return World("drain", (_R0, _R1), **POOLS, faults=0, drains=2)


WORLDS = {"default": default_world, "small": small_world, "large": large_world}
