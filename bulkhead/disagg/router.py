"""The router: the HTTP API's backend in a disaggregated deployment.

It owns the one admission decision (against the pair's smallest limit, read
live from the workers: registry.py), signs the ticket, hands it to both
workers, relays decode's page grant and prefill's manifest between them,
streams decode's tokens back, and decides every request's single terminal
outcome. Here: the route table (one Route per request in flight), the
request deadline and the control-message handlers; router_metrics.py holds
what it reports. Loads no torch. Every decision about a route is a
transition function of bulkhead.protocol.router_job (model checked).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from bulkhead.disagg import messages as m
from bulkhead.disagg.signing import Signer
from bulkhead.disagg.zmq_links import RouterLink
from bulkhead.disagg.registry import LOST_AFTER_S, Worker, WorkerRegistry
from bulkhead.disagg.router_metrics import (RouterCollector, router_fleet_figures, router_info, router_not_ready,
                                            sum_tenant_stats)
from bulkhead.disagg.ticket import sign
from bulkhead.engine.admission import Limits
from bulkhead.engine.outputs import RequestOutput
from bulkhead.errors import (
    BulkheadError, Conflict, NotFound, Overloaded, PeerLostError, RequestTimedOut,
    TransferFailedError,
)
from bulkhead.model.tokenizer import Tokenizer
from bulkhead.protocol import router_job
from bulkhead.protocol.lifecycle import Actor, Phased
from bulkhead.protocol.ticket import Ticket
from bulkhead.protocol.transitions import Effect, JobStep
from bulkhead.protocol.types import Outcome, Phase
from bulkhead.serving.backend import Backend

log = logging.getLogger(__name__)


@dataclass
class Route(Phased):
    actor = Actor.ROUTER
    request_id: str
    prefill: str
    decode: str
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    index: int
    phase: Phase | None = None  # BOOTSTRAPPED, then DONE once the outcome is decided; only through router_job


class DisaggBackend(Backend):
    def __init__(self, tokenizer: Tokenizer, model_id: str, signer: Signer, bind_address: str, auth: str,
                 lost_after_s: float = LOST_AFTER_S, request_timeout_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic, make_link=RouterLink):
        """clock and make_link: the simulator's virtual clock and network
        (bulkhead/sim); production uses time.monotonic and the ZeroMQ link."""
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.signer = signer
        self.key = signer.key
        self.link = make_link(signer, bind_address, on_undeliverable=self._undeliverable)
        self.auth = auth
        self.request_timeout_s = request_timeout_s  # the request deadline uses the event loop's clock
        self.registry = WorkerRegistry(model_id, clock, lost_after_s)
        # The route table shares the registry's (reentrant) lock: see generate().
        self.lock = self.registry.lock
        self.routes: dict[str, Route] = {}
        self._recent: OrderedDict[str, tuple[str, str]] = OrderedDict()  # finished rid -> (prefill, decode)
        self._rooms = itertools.count(1)
        # The tenant table's weight and KV share, read at each admission and
        # signed into the ticket (server/app.py sets them from keys.toml).
        self._weight_of: Callable[[str], float] = lambda _t: 1.0
        self._kv_share_of: Callable[[str], float | None] = lambda _t: None
        self.counters = dict.fromkeys(("assigned", "transfer_failed", "prefill_failed", "peer_lost",
                                       "unexpected_sender", "client_aborts", "registrations"), 0)

    # -- Backend ------------------------------------------------------------
    def start(self) -> None:
        self.link.start(self._on_message, self._on_tick)

    def stop(self) -> None:
        self.link.stop()

    @property
    def workers(self) -> dict[str, Worker]:
        """Registered workers by name (bulkhead/launch/disaggregated.py waits for them all)."""
        return self.registry.workers

    @property
    def limits(self) -> Limits:
        return self.registry.limits()

    def set_tenant_shares(self, weight, kv_share) -> None:
        """The router schedules nothing itself: each ticket carries its
        tenant's share to the workers, whose queues and pools are fair."""
        self._weight_of, self._kv_share_of = weight, kv_share

    # -- drain and resume (the operator API, and a worker's SIGTERM) ---------------
    def drain(self, name: str, force: bool = False) -> dict:
        """Assign nothing more to `name`; it finishes what it holds, then
        reports drained (and, if it is leaving, exits). Refused for the last
        worker of its role still taking requests, unless forced: every
        request would then be refused until one comes back."""
        with self.lock:
            worker = self._live_worker(name)
            others = [w for w in self.registry.assignable() if w.role == worker.role and w.name != name]
            if router_job.drain_worker(worker.draining).outcome == "draining" and not others and not force:
                raise Conflict(f"{name} is the last {worker.role} worker taking requests: draining it would "
                               f"refuse every request until one returns (force=true to drain it anyway)",
                               param="worker", code="last_worker_of_role", value=name)
            worker.draining = True
            self.send(name, m.Drain())  # under the lock: no assign can follow it
        log.info("worker %s draining", name)
        return self.registry.describe_one(name)

    def resume(self, name: str) -> dict:
        """Assign to `name` again (a drained worker that has not exited)."""
        with self.lock:
            self._live_worker(name).draining = False
            self.send(name, m.Resume())
        log.info("worker %s resumed", name)
        return self.registry.describe_one(name)

    def _live_worker(self, name: str) -> Worker:
        worker = self.registry.workers.get(name)
        if worker is None or worker.lost:
            raise NotFound(f"no live worker named {name!r}", param="worker", code="worker_not_found", value=name)
        return worker

    def worker_states(self) -> list[dict]:
        return [self.registry.describe_one(w.name) | {"routes": len(self._routes_of(w.name))}
                for w in self.registry.all()]

    def _on_leaving(self, sender: str, worker: Worker, _message: m.Leaving) -> None:
        """A worker got SIGTERM: drain it (even the last of its role: it is
        going either way, and this way it finishes what it holds first)."""
        try:
            self.drain(sender, force=True)
        except NotFound:  # declared lost meanwhile: its routes are failed, nothing is assigned to it
            log.info("worker %s is leaving after it was declared lost", sender)

    def tenant_stats(self) -> dict[str, dict]:
        """Each tenant's service, queue and pages summed over the workers,
        as their last heartbeats reported them."""
        return sum_tenant_stats(w.info.get("tenants", {}) for w in self.registry.workers.values())

    # -- the route table (under the registry's lock) ---------------------------------
    def _routes_of(self, worker: str) -> list[str]:
        with self.lock:
            return [r.request_id for r in self.routes.values() if worker in (r.prefill, r.decode)]

    def _pair(self) -> tuple[Worker, Worker]:
        # Least loaded of each role: fewest live routes.
        return self.registry.pick_pair(lambda w: len(self._routes_of(w.name)))

    async def generate(self, tickets):
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue = asyncio.Queue()
        routes = []
        prefill, decode = self._pair()
        for i, t in enumerate(tickets):
            signed = sign(Ticket(t, next(self._rooms), 1, weight=self._weight_of(t.tenant),
                                 kv_share=self._kv_share_of(t.tenant)), self.key)
            route = Route(t.request_id, prefill.name, decode.name, loop, updates, i)
            route.take(router_job.submit(""))  # admit() has decided, against the pair's smallest limit
            with self.lock:
                # The pair may have been declared lost, or drained, since
                # _pair() chose it; a route to a lost worker would never be
                # failed. The assign is queued under the lock too: a drain
                # queues its Drain under it, so a worker never gets an
                # assign after its Drain (the link keeps order per worker).
                usable = self.registry.is_assignable(prefill.name) and self.registry.is_assignable(decode.name)
                if route.take(router_job.bootstrap(route.phase, not usable)).outcome == "held":
                    for r in routes:
                        self.routes.pop(r.request_id, None)
                    raise Overloaded("the chosen prefill/decode pair was lost or drained; retry")
                self.routes[t.request_id] = route
                assign = m.Assign(t.request_id, signed)
                self.send(decode.name, assign)
                self.send(prefill.name, assign)
            routes.append(route)
            self.counters["assigned"] += 1
        pending = {r.request_id for r in routes}
        deadline = loop.time() + self.request_timeout_s
        try:
            while pending:
                try:
                    i, out = await asyncio.wait_for(updates.get(), timeout=max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    for rid in pending:  # one outcome, told to both workers, then the client
                        self._finalize(rid, "timed_out")
                    pending.clear()  # finalized once, as timed out (not again as a client abort)
                    raise RequestTimedOut(f"no answer within the router's {self.request_timeout_s:.0f} s deadline",
                                          limit=self.request_timeout_s) from None
                if out.finished:
                    pending.discard(out.request_id)
                yield i, out
        finally:
            for rid in pending:  # the client left: one outcome, told to both workers
                self.counters["client_aborts"] += 1
                self._finalize(rid, "aborted")
            with self.lock:
                for r in routes:
                    self.routes.pop(r.request_id, None)
                    self._recent[r.request_id] = (r.prefill, r.decode)
                while len(self._recent) > 10_000:
                    self._recent.popitem(last=False)

    # -- control plane (link thread) --------------------------------------------
    def _deliver(self, route: Route, out: RequestOutput, after_finalize: bool = False) -> None:
        if route.phase is Phase.DONE and not after_finalize:
            return
        if out.finished:  # decode's last output is the outcome (its tokens, or its error)
            with self.lock:
                route.take(router_job.finished(route.phase))
        route.loop.call_soon_threadsafe(route.queue.put_nowait, (route.index, out))

    def _fail(self, rid: str, error: BulkheadError, outcome: str) -> None:
        with self.lock:
            route = self.routes.get(rid)
        if route is None or route.phase is Phase.DONE:
            return
        # Tell the workers before the client: once the client has its answer
        # the route may be gone.
        if self._finalize_route(route, outcome).outcome == "repeat":
            return  # another thread decided first, and answered
        self._deliver(route, RequestOutput(rid, (), "", (), True, "error", 0, 0, error), after_finalize=True)

    def _finalize(self, rid: str, outcome: str) -> None:
        with self.lock:
            route = self.routes.get(rid)
        if route is not None:
            self._finalize_route(route, outcome)

    def _finalize_route(self, route: Route, outcome: str) -> JobStep:
        """The request's one outcome, sent to both workers of its pair. The
        first decision wins (the link thread and the request's event loop
        may race here); a repeat sends nothing."""
        with self.lock:
            step = route.take(router_job.decide(route.phase))
        if step.does(Effect.FINALIZE_WORKERS):
            for worker in (route.prefill, route.decode):
                self.send(worker, m.Finalize(route.request_id, Outcome(outcome)))
        return step

    def _undeliverable(self, worker: str, message: dict) -> None:
        """The link could not hand a message to a worker (gone, or backed up)."""
        rid = message.get("request_id")
        if rid is not None and message.get("kind") != "finalize":
            self._fail(rid, PeerLostError(f"worker {worker} is unreachable"), "peer_lost")

    def _route_for(self, sender: str, rid: str, role: str) -> Route | None:
        with self.lock:
            route = self.routes.get(rid)
        if route is None:
            return None
        if getattr(route, role) != sender:
            self.counters["unexpected_sender"] += 1  # a worker speaking about a request it does not hold
            return None
        return route

    def send(self, worker: str, message) -> None:
        """One typed message to a worker (bulkhead/disagg/messages.py)."""
        self.link.send(worker, m.encode(message))

    def _on_message(self, sender: str, body: dict) -> None:  # link thread
        try:
            message = m.decode(body)
        except m.MalformedMessage as e:
            self.signer.stats.dropped_malformed += 1
            log.warning("dropped a malformed message from %s: %s", sender, e)
            return
        if isinstance(message, m.Register):
            self._register(sender, message, body["_inc"])  # the signer's envelope names the incarnation
            return
        worker = self.registry.heard_from(sender)
        if worker is None:
            self.send(sender, m.Reregister())
            return
        handler = self._handlers.get(type(message))
        if handler is None:
            self.signer.stats.dropped_malformed += 1  # a kind no worker sends the router
            log.warning("dropped an unexpected %s from %s", message.kind, sender)
            return
        handler(self, sender, worker, message)

    def _on_heartbeat(self, _sender: str, worker: Worker, beat: m.Heartbeat) -> None:
        self.registry.heartbeat(worker, beat.info, beat.counters, beat.control)

    def _relay_grant(self, sender: str, _worker: Worker, grant: m.PagesGranted) -> None:
        route = self._route_for(sender, grant.request_id, "decode")
        if route is not None:
            self.send(route.prefill, grant)

    def _relay_to_decode(self, sender: str, _worker: Worker, message: m.PrefillReady | m.TransferDone) -> None:
        route = self._route_for(sender, message.request_id, "prefill")
        if route is not None and route.phase is not Phase.DONE:
            self.send(route.decode, message)

    def _relay_drain_ack(self, sender: str, _worker: Worker, ack: m.DrainAck) -> None:
        # Acks also arrive after the route is gone (the client left first);
        # decode still needs them to free its pages.
        route = self._route_for(sender, ack.request_id, "prefill")
        pair = (route.prefill, route.decode) if route else self._recent.get(ack.request_id)
        if pair is not None and pair[0] == sender:
            self.send(pair[1], ack)

    def _on_output(self, sender: str, _worker: Worker, message: m.Output) -> None:
        route = self._route_for(sender, message.request_id, "decode")
        if route is not None:
            self._deliver(route, message.output)

    def _on_prefill_failed(self, sender: str, _worker: Worker, failed: m.PrefillFailed) -> None:
        self.counters["prefill_failed"] += 1
        if self._route_for(sender, failed.request_id, "prefill"):
            # The worker's typed refusal (overloaded, adapter unavailable) reaches the client as itself.
            self._fail(failed.request_id, m.error_from_wire(failed.reason, failed.code), "prefill_failed")

    def _on_transfer_failed(self, sender: str, worker: Worker, failed: m.TransferFailed) -> None:
        self.counters["transfer_failed"] += 1
        if self._route_for(sender, failed.request_id, "decode" if worker.role == "decode" else "prefill"):
            self._fail(failed.request_id, TransferFailedError(failed.reason), "transfer_failed")

    _handlers = {
        m.Heartbeat: _on_heartbeat, m.PagesGranted: _relay_grant, m.PrefillReady: _relay_to_decode,
        m.TransferDone: _relay_to_decode, m.DrainAck: _relay_drain_ack, m.Output: _on_output,
        m.PrefillFailed: _on_prefill_failed, m.TransferFailed: _on_transfer_failed, m.Leaving: _on_leaving,
    }

    def _register(self, sender: str, message: m.Register, incarnation: str) -> None:
        info = message.info
        with self.lock:  # the replacement and its orphans are one step (see generate())
            reason, restarted = self.registry.register(sender, info, message.transfer, incarnation)
            orphaned = self._routes_of(sender) if restarted else []
        if reason:
            log.error("refusing worker %s: %s", sender, reason)
            self.send(sender, m.Refused(reason))
            return
        for rid in orphaned:  # a restarted worker has no state for its old requests
            self._fail(rid, PeerLostError(f"worker {sender} restarted while serving this request"), "peer_lost")
        self.counters["registrations"] += 1
        log.info("worker %s registered (%s, context %d, pool %d tokens)", sender, info["role"],
                 info["context_length"], info["pool_tokens"])
        self.send(sender, m.Registered())

    def _on_tick(self) -> None:
        for w, silent_s in self.registry.sweep():
            if w.draining and w.info.get("drained"):
                # It drained (held nothing) and left: no route needs it any more.
                log.info("worker %s left after draining", w.name)
                self.registry.forget(w.name)
                continue
            log.error("worker %s lost (no heartbeat for %.1fs)", w.name, silent_s)
            for rid in self._routes_of(w.name):
                self.counters["peer_lost"] += 1
                self._fail(rid, PeerLostError(f"worker {w.name} was lost while serving this request"), "peer_lost")
            self.registry.forget(w.name)

    # -- observability (router_metrics.py: /server_info, /ready, /metrics, /metrics/fleet) ----------
    info, not_ready, fleet_figures = router_info, router_not_ready, router_fleet_figures

    def collector(self) -> RouterCollector:
        return RouterCollector(self)
