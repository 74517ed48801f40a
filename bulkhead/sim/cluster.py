"""Router + 2 prefill + 2 decode workers, the real classes, wired to the
simulator at the seams docs/simulation.md lists (clock, link, transfer source
and target, transfer thread, engine thread). Each event costs virtual time,
so messages, engine steps and transfers interleave differently per seed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bulkhead.disagg.signing import Signer
from bulkhead.disagg.decode_worker import DecodeWorker
from bulkhead.disagg.prefill_worker import PrefillWorker
from bulkhead.disagg.router import DisaggBackend
from bulkhead.kv.ledger import LedgerError
from bulkhead.seams import Seams
from bulkhead.sim.context import SimContext
from bulkhead.sim.engines import MODEL_ID, CanaryTokenizer, SimGeometry, build_sim_engine
from bulkhead.sim.network import Network, SimRouterLink, SimWorkerLink, guarded
from bulkhead.sim.transfer import DataPlane, SimSource, SimTarget

log = logging.getLogger(__name__)

KEY = b"bulkhead-simulated-cluster-key!!"
WORKERS = ("prefill-0", "prefill-1", "decode-0", "decode-1")
TICK_S = 0.05  # as the links tick (zmq_links.TICK_S); every deadline here is 50 ms or longer
STEP_S = (0.001, 0.004)  # one engine step
TRANSFER_START_S = (0.0005, 0.005)  # the transfer thread picking the job up


@dataclass(frozen=True)
class Timing:
    """The runtime's timeouts, scaled down so a seed ends in seconds of virtual time."""

    lost_after_s: float = 1.5  # router: no heartbeat this long -> worker lost (production 3 s)
    request_timeout_s: float = 4.0  # router: no answer -> 504 (production 600 s)
    drain_lease_s: float = 1.0  # decode: no drain ack -> pages reused after this (production 30 s)


@dataclass(eq=False)  # compared by identity: one object per incarnation
class Node:
    """One incarnation of a worker process."""

    name: str
    incarnation: int
    worker: object = None  # its PrefillWorker or DecodeWorker, once built
    target: SimTarget | None = None  # decode's
    alive: bool = True
    pump_scheduled: bool = False


class _Executor:
    """prefill's transfer thread: a submitted job runs as a later event."""

    def __init__(self, cluster: Cluster, node: Node):
        self.cluster, self.node = cluster, node

    def submit(self, fn, *args):
        ctx = self.cluster.ctx
        ctx.after(ctx.rng.uniform(*TRANSFER_START_S), self.cluster.run_in, self.node, fn, *args)


class Cluster:
    def __init__(self, ctx: SimContext, geo: SimGeometry = SimGeometry(), timing: Timing = Timing()):
        self.ctx, self.geo, self.timing = ctx, geo, timing
        self.network = Network(ctx)
        self.plane = DataPlane(ctx)
        self.nodes: dict[str, Node] = {}
        self.retired: list[Node] = []  # crashed incarnations
        self.router = DisaggBackend(
            CanaryTokenizer(), MODEL_ID, Signer(KEY, "router", incarnation="router#1"), "sim://router", "sim",
            lost_after_s=timing.lost_after_s, request_timeout_s=timing.request_timeout_s, clock=ctx.now,
            make_link=lambda signer, address, on_undeliverable: SimRouterLink(self.network, signer, address,
                                                                               on_undeliverable))
        self._incarnations = {name: 0 for name in WORKERS}
        self.running = False

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        self.running = True
        self.router.start()
        self._every(TICK_S, self.ctx.rng.uniform(0, TICK_S), lambda: self.running,
                    lambda: guarded(self.ctx, "router", self.router.link.on_tick))
        for name in WORKERS:
            self.boot(name)
        for at, name, down_for in self.ctx.plan.crashes:
            self.ctx.after(at, self.crash, name, down_for)

    def stop(self) -> None:
        self.running = False

    def boot(self, name: str) -> None:
        ctx, geo = self.ctx, self.geo
        self._incarnations[name] += 1
        inc = self._incarnations[name]
        signer = Signer(KEY, name, incarnation=f"{name}#{inc}")
        node = Node(name, inc)

        # The simulated network, data plane and transfer thread, at the seams
        # where production has ZeroMQ, a transfer backend and a thread.
        seams = Seams(make_link=lambda signer, address: SimWorkerLink(self.network, lambda: self.kick(node), signer,
                                                                      address),
                      make_source=lambda _name, **_opts: SimSource(ctx, self.plane),
                      make_transfer_executor=lambda: _Executor(self, node))
        common = dict(clock=ctx.now, seams=seams)
        if name.startswith("decode"):
            node.target = SimTarget(ctx, name, inc, geo.layout, geo.decode_pages)
            built = build_sim_engine(geo, geo.decode_pages, name, self._bad_read, prefill_only=False,
                                     pool=node.target.pool)
            node.target.ledger = built.engine.ledger
            self.plane.targets[name] = node.target
            node.worker = DecodeWorker(built, MODEL_ID, signer, "sim://router", target=node.target,
                                       drain_lease_s=self.timing.drain_lease_s, **common)
        else:
            built = build_sim_engine(geo, geo.prefill_pages, name, self._bad_read, prefill_only=True)
            node.worker = PrefillWorker(built, MODEL_ID, signer, "sim://router", **common)
        self.nodes[name] = node
        node.worker.link.start(node.worker.on_message, node.worker.on_tick)
        self._every(TICK_S, ctx.rng.uniform(0, TICK_S), lambda: node.alive and self.running,
                    lambda: self.run_in(node, node.worker.on_tick))
        ctx.log(f"{name} boots (incarnation {inc})")

    def crash(self, name: str, down_for: float) -> None:
        node = self.nodes[name]
        node.alive = False
        node.worker.link.stop()
        if node.target is not None:
            node.target.close()
        self.retired.append(node)
        self.ctx.fire("crash", f"{name} (incarnation {node.incarnation}) dies for {down_for:.2f}s")
        self.ctx.after(down_for, self._restart, name)

    def _restart(self, name: str) -> None:
        if self.running:
            self.boot(name)

    # -- running worker code --------------------------------------------------
    def run_in(self, node: Node, fn, *args) -> None:
        """Run worker code as one event (a dead incarnation runs nothing), then its engine."""
        if not node.alive:
            return
        try:
            fn(*args)
        except Exception as e:  # the real loops log and carry on; here it is a finding
            self.ctx.violation("runtime_error", f"{node.name}: {e!r}")
        self.kick(node)

    def kick(self, node: Node) -> None:
        """Schedule the engine's next step if it has anything to do (the engine thread waking)."""
        if node.alive and not node.pump_scheduled and node.worker.engine.has_pending():
            node.pump_scheduled = True
            self.ctx.after(self.ctx.rng.uniform(*STEP_S), self._pump, node)

    def _pump(self, node: Node) -> None:
        node.pump_scheduled = False
        if not node.alive:
            return
        engine = node.worker.engine
        try:
            engine.run_once()
            engine.check_integrity()
        except (AssertionError, LedgerError) as e:
            self.ctx.violation("ledger_integrity", f"{node.name}: {e}")
        except Exception as e:
            self.ctx.violation("runtime_error", f"{node.name} engine: {e!r}")
        self.kick(node)

    def _every(self, period: float, phase: float, while_, fn) -> None:
        def tick() -> None:
            if not while_():
                return
            fn()
            self.ctx.after(period, tick)

        self.ctx.after(phase, tick)

    def _bad_read(self, bad) -> None:
        self.ctx.stats["bad_reads"] += 1
        self.ctx.bad_reads.append((self.ctx.now(), *bad))

    # -- state the invariants read ----------------------------------------------
    def live_workers(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.alive]

    def quiescent(self) -> bool:
        if len(self.live_workers()) != len(WORKERS) or self.plane.in_flight or self.network.in_flight:
            return False
        for node in self.live_workers():
            w, ledger = node.worker, node.worker.engine.ledger
            if w.jobs or w.engine.has_pending() or ledger.num_free != ledger.num_pages:
                return False
        return True
