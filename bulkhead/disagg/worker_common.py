"""What the prefill and decode workers share: registration and heartbeats."""

from __future__ import annotations

import logging
import threading
import time

from bulkhead.disagg.control import Signer
from bulkhead.disagg.links import WorkerLink
from bulkhead.disagg.ticket import SignedTicket, TicketError
from bulkhead.engine.builder import BuiltEngine
from bulkhead.server.backend import engine_info

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.5


class WorkerBase:
    role = "worker"

    def __init__(self, built: BuiltEngine, model_id: str, signer: Signer, router_address: str):
        self.built = built
        self.engine = built.engine
        self.model_id = model_id
        self.signer = signer
        self.key = signer.key
        self.name = signer.sender
        self.link = WorkerLink(signer, router_address, replay_fault=self.replay_fault)
        self.lock = threading.Lock()  # guards the per-request job tables
        self.registered = False
        self.counters: dict[str, int] = {}
        self._last_beat = 0.0
        self._stopped = threading.Event()

    def replay_fault(self) -> bool:
        return False

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
        return {"kind": "heartbeat", "info": self.info(), "counters": counters,
                "control": vars(self.signer.stats).copy()}

    def on_tick(self) -> None:
        now = time.monotonic()
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
            self.registered = False
        else:
            self.handle(kind, msg)

    def handle(self, kind: str, msg: dict) -> None:
        raise NotImplementedError

    def run(self) -> None:
        self.engine.start()
        self.link.start(self.on_message, self.on_tick)
        log.info("%s running (%s)", self.name, self.role)
        try:
            while not self._stopped.wait(1.0):
                pass
        finally:
            self.link.stop()
            self.engine.stop()

    def stop(self) -> None:
        self._stopped.set()
