"""What the prefill and decode workers share: registration and heartbeats."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from bulkhead.disagg.control import Signer
from bulkhead.protocol.lifecycle import IllegalTransition
from bulkhead.disagg.links import WorkerLink
from bulkhead.disagg.ticket import SignedTicket, TicketError
from bulkhead.engine.builder import BuiltEngine
from bulkhead.faults import Faults
from bulkhead.serving.info import engine_info

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.5


class WorkerBase:
    role = "worker"

    def __init__(self, built: BuiltEngine, model_id: str, signer: Signer, router_address: str,
                 clock: Callable[[], float] = time.monotonic, make_link=WorkerLink):
        """clock and make_link: the simulator's virtual clock and network
        (bulkhead/sim); production uses time.monotonic and the ZeroMQ link."""
        self.built = built
        self.engine = built.engine
        self.model_id = model_id
        self.signer = signer
        self.key = signer.key
        self.name = signer.sender
        self.clock = clock  # every deadline, lease and heartbeat reads this
        self.faults = Faults()  # test-only (BULKHEAD_FAULTS_FILE); never armed in production
        self.link = make_link(signer, router_address, faults=self.faults)
        self.lock = threading.Lock()  # guards the per-request job tables
        self.registered = False
        self.counters: dict[str, int] = {}
        self._last_beat = 0.0

    def accept_ticket(self, ticket: SignedTicket, refusal_kind: str) -> bool:
        """Verify an assigned ticket (signature, and this worker's own limits:
        a re-check, never a new decision); a refusal fails the request."""
        self.count("assigned")
        try:
            ticket.verify(self.key, self.built.limits.context_length)
        except TicketError as e:
            self.count("tickets_refused")
            self.link.send({"kind": refusal_kind, "request_id": ticket.request_id, "reason": str(e)})
            return False
        return True

    @contextmanager
    def failing_closed(self, rid: str) -> Iterator[None]:
        """Around a job's phase changes: a step the lifecycle table does not
        have skips the rest of the block and fails the request closed
        (fail_closed), logged and counted, instead of raising out of the
        link or engine thread. Enter it outside self.lock: fail_closed
        takes the lock itself."""
        try:
            yield
        except IllegalTransition as e:
            self.count("illegal_transitions")
            log.error("%s failing %s closed: %s", self.name, rid, e)
            self.fail_closed(rid, f"the request took a step its protocol does not have ({e})")

    def fail_closed(self, rid: str, reason: str) -> None:
        """Fail the request with its typed error through the router, whose
        finalize then ends the job through the table (so pages still wait
        for the drain ack or the lease)."""
        raise NotImplementedError

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def info(self) -> dict:
        return engine_info(self.built, self.model_id, self.role) | {"name": self.name}

    def extra_registration(self) -> dict:
        return {}

    def heartbeat_body(self) -> dict:
        counters = dict(self.counters)
        cache = self.engine.scheduler.cache
        if cache is not None:
            counters |= {"prefix_cache_hit_pages": cache.hits, "prefix_cache_miss_pages": cache.misses,
                         "prefix_cache_pages": cache.num_pages}
        counters |= self.faults.counters()
        return {"kind": "heartbeat", "info": self.info(), "counters": counters,
                "control": vars(self.signer.stats).copy()}

    def on_tick(self) -> None:
        now = self.clock()
        if now - self._last_beat >= HEARTBEAT_S:
            self._last_beat = now
            if not self.registered:
                self.link.send({"kind": "register", "info": self.info(), **self.extra_registration()})
            self.link.send(self.heartbeat_body())

    def on_message(self, msg: dict) -> None:
        kind = msg.get("kind")
        if kind == "registered":
            self.registered = True
            log.info("%s registered with the router", self.name)
        elif kind == "refused":
            log.error("router refused %s: %s", self.name, msg.get("reason"))
        elif kind == "reregister":
            # The router does not know us: it restarted, or declared us lost
            # and failed our requests. Either way no route is left for our
            # jobs and no finalize will come, so end them here (fail closed,
            # pages back once no write can land) before registering again.
            if self.registered:
                self.abandon_jobs()
            self.registered = False
        else:
            self.handle(kind, msg)

    def handle(self, kind: str, msg: dict) -> None:
        raise NotImplementedError

    def abandon_jobs(self) -> None:
        """Finalize every job as the router would have (link thread)."""
        with self.lock:
            orphans = list(self.jobs)
        for rid in orphans:
            self.count("jobs_abandoned")
            self._finalize(rid)

    def run(self) -> None:
        """Serve until stop(); the engine runs on this (the main) thread, see
        Engine.run_forever."""
        self.link.start(self.on_message, self.on_tick)
        log.info("%s running (%s)", self.name, self.role)
        try:
            self.engine.run_forever()
        finally:
            self.link.stop()

    def stop(self) -> None:
        self.engine.stop()
