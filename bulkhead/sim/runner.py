"""One seed from start to verdict, and many seeds with their fault tally."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

from bulkhead.sim.client import Outcome, make_workload, run_client
from bulkhead.sim.cluster import WORKERS, Cluster
from bulkhead.sim.context import SimContext, Violation
from bulkhead.sim.faults import FAULT_KINDS, FaultPlan
from bulkhead.sim.invariants import LIVENESS, check_run

SETTLE_POLL_S = 0.05
SETTLE_MAX_S = 10.0  # after the last client: leases, backstops and late writes all end well within this
RUN_MAX_S = 120.0  # virtual; a run still going by then is itself a finding


@dataclass
class SeedResult:
    seed: int
    plan: str
    violations: list[Violation]
    fired: Counter
    stats: Counter
    virtual_s: float
    trace: list[str] = field(default_factory=list)
    findings: list[Violation] = field(default_factory=list)  # liveness after a lost message


def run_seed(seed: int, honour_write_guard: bool = True, trace: bool = False) -> SeedResult:
    plan_rng = SimContext(seed=seed, plan=FaultPlan()).rng  # the plan comes first from the seed's stream
    ctx = SimContext(seed=seed, plan=FaultPlan.draw(plan_rng, WORKERS), honour_write_guard=honour_write_guard,
                     tracing=trace)
    ctx.rng = plan_rng  # one stream for the whole run
    cluster = Cluster(ctx)
    ctx.log(f"seed {seed}: {ctx.plan.describe()}" + ("" if honour_write_guard else "; WRITE GUARD IGNORED"))
    requests = make_workload(ctx, cluster.geo.decode_pages * cluster.geo.page_size)
    outcomes = {r.request_id: Outcome() for r in requests}
    state = {"quiescent": False}

    async def main() -> None:
        cluster.start()
        await asyncio.gather(*(run_client(ctx, cluster.router, r, outcomes[r.request_id]) for r in requests))
        until = ctx.now() + SETTLE_MAX_S
        while ctx.now() < until and not cluster.quiescent():
            await asyncio.sleep(SETTLE_POLL_S)
        state["quiescent"] = cluster.quiescent()
        cluster.stop()

    loop = ctx.loop
    start = loop.now
    try:
        loop.run_until_complete(asyncio.wait_for(main(), RUN_MAX_S))
    except asyncio.TimeoutError:
        ctx.violation("no_progress", f"the run did not end within {RUN_MAX_S:.0f} virtual seconds")
    finally:
        loop.close()
    check_run(ctx, cluster, requests, outcomes, state["quiescent"])
    for o in outcomes.values():
        ctx.stats[f"outcome_{o.kind}"] += 1
    # Prefill passes handed out a slice of layers per step (engine/pass_slices.py).
    ctx.stats["pass_slices"] += sum(n.worker.engine.stats.slices for n in [*cluster.nodes.values(), *cluster.retired])
    # Without retransmission a lost message can strand a request: liveness, not isolation (invariants.py).
    lost = ctx.stats["messages_lost"] > 0
    violations = [v for v in ctx.violations if not (lost and v.kind in LIVENESS)]
    findings = [v for v in ctx.violations if lost and v.kind in LIVENESS]
    return SeedResult(seed, ctx.plan.describe(), violations, ctx.fired, ctx.stats, loop.now - start, ctx.trace,
                      findings)


@dataclass
class Summary:
    seeds: int = 0
    failing: list[SeedResult] = field(default_factory=list)
    fired: Counter = field(default_factory=Counter)
    stats: Counter = field(default_factory=Counter)
    violations: Counter = field(default_factory=Counter)
    findings: Counter = field(default_factory=Counter)
    finding_seeds: list[int] = field(default_factory=list)
    honour_write_guard: bool = True
    wall_s: float = 0.0
    virtual_s: float = 0.0

    @property
    def never_fired(self) -> list[str]:
        return [k for k in FAULT_KINDS if not self.fired[k]]

    @property
    def ok(self) -> bool:
        return not self.failing and not self.never_fired


def run_seeds(seeds, honour_write_guard: bool = True) -> Summary:
    summary = Summary(honour_write_guard=honour_write_guard)
    start = time.perf_counter()
    with quiet_runtime_logs():
        for seed in seeds:
            result = run_seed(seed, honour_write_guard)
            summary.seeds += 1
            summary.fired.update(result.fired)
            summary.stats.update(result.stats)
            summary.virtual_s += result.virtual_s
            if result.findings:
                summary.findings.update(v.kind for v in result.findings)
                summary.finding_seeds.append(seed)
            if result.violations:
                summary.failing.append(result)
                summary.violations.update(v.kind for v in result.violations)
    summary.wall_s = time.perf_counter() - start
    return summary


@contextmanager
def quiet_runtime_logs():
    """The workers log every failed transfer; thousands of seeds of that is noise."""
    logger = logging.getLogger("bulkhead")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)
