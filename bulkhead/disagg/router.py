"""The router: the HTTP API's backend in a disaggregated deployment.

It owns the one admission decision (against the smallest limit of the
prefill/decode pair, read live from the workers), signs the ticket, hands it
to both workers, relays decode's page grant and prefill's manifest between
them, streams decode's tokens back, and decides every request's single
terminal outcome. Workers register over the authenticated control plane;
a pair whose model, KV layout, page size or dtype differ is refused.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from bulkhead import __version__
from bulkhead.disagg.control import Signer
from bulkhead.protocol.lifecycle import Actor, Event, Phased
from bulkhead.disagg.links import RouterLink
from bulkhead.protocol.types import Phase
from bulkhead.disagg.ticket import SignedTicket
from bulkhead.disagg.wire import output_from_dict, params_to_dict
from bulkhead.engine.admission import Limits
from bulkhead.engine.outputs import RequestOutput
from bulkhead.errors import (
    BulkheadError, EngineFailure, Overloaded, PeerLostError, RequestTimedOut, TransferFailedError,
)
from bulkhead.model.tokenizer import Tokenizer
from bulkhead.serving.backend import Backend

log = logging.getLogger(__name__)

LOST_AFTER_S = 3.0
# What must be equal across a pair for KV written by one to mean the same to the other.
PAIR_KEYS = ("model", "kv_layout", "page_size", "kv_dtype", "vocab_size")


@dataclass
class Worker:
    name: str
    role: str
    info: dict
    transfer: dict | None
    last_seen: float
    counters: dict = field(default_factory=dict)
    control: dict = field(default_factory=dict)
    lost: bool = False
    incarnation: str = ""
    heartbeats: int = 0  # received; lets a reader wait for counters newer than a moment it knows


@dataclass
class Route(Phased):
    actor = Actor.ROUTER
    request_id: str
    prefill: str
    decode: str
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    index: int
    phase: Phase | None = None  # BOOTSTRAPPED, then DONE once the outcome is decided; only through advance()


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
        self.clock = clock  # heartbeat ages; the request deadline uses the event loop's clock
        self.link = make_link(signer, bind_address, on_undeliverable=self._undeliverable)
        self.auth = auth
        self.lost_after_s = lost_after_s
        self.request_timeout_s = request_timeout_s
        self.workers: dict[str, Worker] = {}
        self.refused: dict[str, str] = {}  # worker -> why the pairing gate refused it
        self.routes: dict[str, Route] = {}
        self._recent: OrderedDict[str, tuple[str, str]] = OrderedDict()  # finished rid -> (prefill, decode)
        self.lock = threading.Lock()
        self._rooms = itertools.count(1)
        self.counters = {"assigned": 0, "transfer_failed": 0, "prefill_failed": 0, "peer_lost": 0,
                         "unexpected_sender": 0,
                         "client_aborts": 0, "registrations": 0}

    # -- Backend ------------------------------------------------------------
    def start(self) -> None:
        self.link.start(self._on_message, self._on_tick)

    def stop(self) -> None:
        self.link.stop()

    def _pair(self) -> tuple[Worker, Worker]:
        with self.lock:
            live = [w for w in self.workers.values() if not w.lost]
        prefills = [w for w in live if w.role == "prefill"]
        decodes = [w for w in live if w.role == "decode"]
        if not prefills or not decodes:
            raise Overloaded(f"no prefill/decode pair is registered ({len(prefills)} prefill, "
                             f"{len(decodes)} decode workers live)")
        # Least loaded of each role: fewest live routes.
        load = lambda w: sum(1 for r in self.routes.values() if w.name in (r.prefill, r.decode))  # noqa: E731
        return min(prefills, key=load), min(decodes, key=load)

    @property
    def limits(self) -> Limits:
        with self.lock:
            live = [w.info for w in self.workers.values() if not w.lost]
        if not any(i["role"] == "prefill" for i in live) or not any(i["role"] == "decode" for i in live):
            raise Overloaded("no prefill/decode pair is registered yet")
        # One admission decision against the smallest limit of every worker
        # that could hold the request's KV.
        return Limits(
            context_length=min(i["context_length"] for i in live),
            pool_tokens=min(i["pool_tokens"] for i in live),
            page_size=live[0]["page_size"],
            vocab_size=live[0]["vocab_size"],
        )

    async def generate(self, tickets):
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue = asyncio.Queue()
        routes = []
        prefill, decode = self._pair()
        for i, t in enumerate(tickets):
            signed = SignedTicket(
                t.request_id, t.tenant, next(self._rooms), 1, t.prompt_token_ids, t.params.max_tokens,
                t.context_length, params_to_dict(t.params), t.cache_salt,
            ).signed(self.key)
            route = Route(t.request_id, prefill.name, decode.name, loop, updates, i)
            route.advance(Event.ADMIT)  # admit() has already decided, against the pair's smallest limit
            route.advance(Event.BOOTSTRAP)  # the room is the ticket's; rooms never run out here
            with self.lock:
                # The pair may have been declared lost since _pair() chose it;
                # a route to a lost worker would never be failed.
                if any(self.workers.get(n) is None or self.workers[n].lost for n in (prefill.name, decode.name)):
                    for r in routes:
                        self.routes.pop(r.request_id, None)
                    raise Overloaded("the chosen prefill/decode pair was lost; retry")
                self.routes[t.request_id] = route
            routes.append(route)
            self.counters["assigned"] += 1
            msg = {"kind": "assign", "request_id": t.request_id, "ticket": signed.to_dict()}
            self.link.send(decode.name, msg)
            self.link.send(prefill.name, msg)
        pending = {r.request_id for r in routes}
        deadline = loop.time() + self.request_timeout_s
        try:
            while pending:
                try:
                    i, out = await asyncio.wait_for(updates.get(), timeout=max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    for rid in list(pending):  # one outcome, told to both workers, then the client
                        with self.lock:
                            route = self.routes.get(rid)
                        if route is not None:
                            self._finalize_route(route, "timed_out")
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
        if out.finished:
            self._decide(route)  # decode's last output is the outcome (its tokens, or its error)
        route.loop.call_soon_threadsafe(route.queue.put_nowait, (route.index, out))

    def _fail(self, rid: str, error: BulkheadError, outcome: str) -> None:
        with self.lock:
            route = self.routes.get(rid)
        if route is None or route.phase is Phase.DONE:
            return
        # Tell the workers before the client: once the client has its answer
        # the route may be gone.
        self._finalize_route(route, outcome)
        self._deliver(route, RequestOutput(rid, (), "", (), True, "error", 0, 0, error), after_finalize=True)

    def _finalize(self, rid: str, outcome: str) -> None:
        with self.lock:
            route = self.routes.get(rid)
        if route is not None:
            self._finalize_route(route, outcome)

    def _finalize_route(self, route: Route, outcome: str) -> None:
        """The request's one outcome, sent to both workers of its pair (again
        on a repeat, as ever: workers ignore a repeated finalize)."""
        self._decide(route)
        for worker in (route.prefill, route.decode):
            self.link.send(worker, {"kind": "finalize", "request_id": route.request_id, "outcome": outcome})

    def _decide(self, route: Route) -> None:
        """The route's outcome is decided: DONE, once (the first decision
        wins; the link thread and the request's event loop may race here)."""
        with self.lock:
            if route.phase is not Phase.DONE:
                route.advance(Event.FINALIZE)

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

    def _on_message(self, sender: str, msg: dict) -> None:
        kind = msg.get("kind")
        if kind == "register":
            self._register(sender, msg)
            return
        with self.lock:
            worker = self.workers.get(sender)
        if worker is None:
            self.link.send(sender, {"kind": "reregister"})
            return
        worker.last_seen = self.clock()
        rid = msg.get("request_id")
        if kind == "heartbeat":
            worker.info, worker.counters, worker.control = msg["info"], msg["counters"], msg["control"]
            worker.heartbeats += 1
        elif kind == "pages_granted":
            route = self._route_for(sender, rid, "decode")
            if route is not None:
                self.link.send(route.prefill, msg)
        elif kind in ("transfer_done", "prefill_ready"):
            route = self._route_for(sender, rid, "prefill")
            if route is not None and route.phase is not Phase.DONE:
                self.link.send(route.decode, msg)
        elif kind == "drain_ack":
            # Acks also arrive after the route is gone (the client left first);
            # decode still needs them to free its pages.
            route = self._route_for(sender, rid, "prefill")
            pair = (route.prefill, route.decode) if route else self._recent.get(rid)
            if pair is not None and pair[0] == sender:
                self.link.send(pair[1], msg)
        elif kind == "output":
            out = output_from_dict(msg["output"])
            route = self._route_for(sender, out.request_id, "decode")
            if route is not None:
                self._deliver(route, out)
        elif kind == "prefill_failed":
            self.counters["prefill_failed"] += 1
            if self._route_for(sender, rid, "prefill"):
                error = Overloaded(msg["reason"]) if msg.get("code") == "server_overloaded" else EngineFailure(
                    msg.get("reason", "prefill failed"))
                self._fail(rid, error, "prefill_failed")
        elif kind == "transfer_failed":
            self.counters["transfer_failed"] += 1
            if self._route_for(sender, rid, "decode" if worker.role == "decode" else "prefill"):
                self._fail(rid, TransferFailedError(msg.get("reason", "KV transfer failed")), "transfer_failed")

    def _register(self, sender: str, msg: dict) -> None:
        info = msg["info"]
        reason = self._gate(info)
        if reason:
            self.refused[sender] = reason
            log.error("refusing worker %s: %s", sender, reason)
            self.link.send(sender, {"kind": "refused", "reason": reason})
            return
        with self.lock:
            previous = self.workers.get(sender)
            self.workers[sender] = Worker(sender, info["role"], info, msg.get("transfer"), self.clock(),
                                          incarnation=msg["_inc"])
            orphaned = [] if previous is None or previous.incarnation == msg["_inc"] else [
                r.request_id for r in self.routes.values() if sender in (r.prefill, r.decode)]
        for rid in orphaned:  # a restarted worker has no state for its old requests
            self._fail(rid, PeerLostError(f"worker {sender} restarted while serving this request"), "peer_lost")
        self.refused.pop(sender, None)
        self.counters["registrations"] += 1
        log.info("worker %s registered (%s, context %d, pool %d tokens)", sender, info["role"],
                 info["context_length"], info["pool_tokens"])
        self.link.send(sender, {"kind": "registered"})

    def _gate(self, info: dict) -> str | None:
        if info.get("role") not in ("prefill", "decode"):
            return f"role {info.get('role')!r} is not a worker role"
        if info.get("model") != self.model_id:
            return f"model {info.get('model')!r} differs from the router's {self.model_id!r}"
        with self.lock:
            others = [w.info for w in self.workers.values() if not w.lost]
        for other in others:
            for key in PAIR_KEYS:
                if other.get(key) != info.get(key):
                    return f"{key} {info.get(key)!r} differs from worker {other['name']}'s {other.get(key)!r}"
        return None

    def _on_tick(self) -> None:
        now = self.clock()
        with self.lock:
            newly_lost = [w for w in self.workers.values() if not w.lost and now - w.last_seen > self.lost_after_s]
            for w in newly_lost:
                w.lost = True
        for w in newly_lost:
            log.error("worker %s lost (no heartbeat for %.1fs)", w.name, now - w.last_seen)
            with self.lock:
                affected = [r.request_id for r in self.routes.values() if w.name in (r.prefill, r.decode)]
            for rid in affected:
                self.counters["peer_lost"] += 1
                self._fail(rid, PeerLostError(f"worker {w.name} was lost while serving this request"), "peer_lost")
            with self.lock:
                self.workers.pop(w.name, None)  # it may come back and register again

    # -- observability ------------------------------------------------------------
    def info(self) -> dict:
        with self.lock:
            workers = [dict(w.info, counters=w.counters, control=w.control, lost=w.lost, heartbeats=w.heartbeats)
                       for w in self.workers.values()]
        try:
            limits = self.limits
            advertised = {"context_length": limits.context_length, "max_input_tokens": limits.max_input_tokens,
                          "pool_tokens": limits.pool_tokens, "page_size": limits.page_size}
        except Overloaded:
            advertised = {"context_length": None, "max_input_tokens": None, "pool_tokens": None}
        contexts = {w["context_length"] for w in workers}
        return {
            "engine": "bulkhead", "version": __version__, "role": "router", "model": self.model_id,
            **advertised, "kv_dtype": workers[0]["kv_dtype"] if workers else None,
            "workers": workers, "refused_workers": dict(self.refused),
            "worker_limits_differ": len(contexts) > 1,
            # One worker without its guards (--unsafe-no-guards) is enough to lose isolation.
            "guards": "off" if any(w.get("guards") != "on" for w in workers) else "on",
            "control_plane": vars(self.signer.stats).copy(), "counters": dict(self.counters),
            "auth": self.auth,
        }

    def collector(self):
        return _RouterCollector(self)


class _RouterCollector:
    def __init__(self, backend: DisaggBackend):
        self.b = backend

    def collect(self):
        with self.b.lock:
            workers = list(self.b.workers.values())
        pages = GaugeMetricFamily("bulkhead_kv_pages", "KV pool pages by worker and state", labels=["worker", "state"])
        counters = CounterMetricFamily("bulkhead_worker_events", "Worker event counts", labels=["worker", "event"])
        for w in workers:
            for state in ("free", "owned", "dirty"):
                pages.add_metric([w.name, state], w.info.get(f"{state}_pages", 0))
            for event, n in w.counters.items():
                counters.add_metric([w.name, event], n)
            for event, n in w.control.items():
                counters.add_metric([w.name, f"control_{event}"], n)
        yield pages
        yield counters
        router = CounterMetricFamily("bulkhead_router_events", "Router event counts", labels=["event"])
        for event, n in self.b.counters.items():
            router.add_metric([event], n)
        for event, n in vars(self.b.signer.stats).items():
            router.add_metric([f"control_{event}"], n)
        yield router
        failures = sum(w.info.get("engine_failures", 0) for w in workers)
        yield CounterMetricFamily("bulkhead_engine_failures", "Steps failed closed on any worker", failures)
