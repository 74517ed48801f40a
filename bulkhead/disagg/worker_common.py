"""What the prefill and decode workers share: registration and heartbeats."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from bulkhead.disagg.signing import Signer
from bulkhead.disagg import messages as m
from bulkhead.disagg.ticket import SignedTicket, TicketError
from bulkhead.engine.builder import BuiltEngine
from bulkhead.protocol.lifecycle import IllegalTransition
from bulkhead.seams import PRODUCTION, Seams
from bulkhead.serving.info import engine_info

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.5


class WorkerBase:
    role = "worker"

    def __init__(self, built: BuiltEngine, model_id: str, signer: Signer, router_address: str,
                 clock: Callable[[], float] = time.monotonic, seams: Seams = PRODUCTION):
        """clock: the simulator's virtual clock; production uses time.monotonic.
        seams: the link, transfer source and executor a harness may swap in
        (the simulator's network, the fault matrix's wrappers)."""
        self.built = built
        self.engine = built.engine
        self.lineage = built.engine.ledger.lineage  # grants, transfers and commits go where the ledger's go
        self.model_id = model_id
        self.signer = signer
        self.key = signer.key
        self.name = signer.sender
        self.clock = clock  # every deadline, lease and heartbeat reads this
        self.seams = seams
        self.link = seams.make_link(signer, router_address)
        self.lock = threading.Lock()  # guards the per-request job tables
        self.registered = False
        self.counters: dict[str, int] = {}
        self._last_beat = 0.0

    def send(self, message) -> None:
        """One typed message to the router (bulkhead/disagg/messages.py)."""
        self.link.send(m.encode(message))

    def accept_ticket(self, ticket: SignedTicket, refusal: type) -> bool:
        """Verify an assigned ticket (signature, and this worker's own limits:
        a re-check, never a new decision); a refusal fails the request."""
        self.count("assigned")
        try:
            ticket.verify(self.key, self.built.limits.context_length)
        except TicketError as e:
            self.count("tickets_refused")
            self.send(refusal(ticket.request_id, str(e)))
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

    def transfer_endpoint(self) -> dict | None:
        """Where writers reach this worker's pool (decode), sent with Register."""
        return None

    def heartbeat(self) -> m.Heartbeat:
        counters = dict(self.counters)
        cache = self.engine.scheduler.cache
        if cache is not None:
            counters |= {"prefix_cache_hit_pages": cache.hits, "prefix_cache_miss_pages": cache.misses,
                         "prefix_cache_pages": cache.num_pages}
        lineage = self.lineage.stats()
        if lineage is not None:
            counters |= {f"lineage_{k}": v for k, v in lineage.items() if isinstance(v, int)}
        counters |= self.seams.counters()
        return m.Heartbeat(self.info(), counters, vars(self.signer.stats).copy())

    def on_tick(self) -> None:
        now = self.clock()
        if now - self._last_beat >= HEARTBEAT_S:
            self._last_beat = now
            if not self.registered:
                self.send(m.Register(self.info(), self.transfer_endpoint()))
            self.send(self.heartbeat())

    def on_message(self, body: dict) -> None:
        """A message from the router (link thread): decoded, then handled by
        the handler this worker's table names for its type."""
        try:
            message = m.decode(body)
        except m.MalformedMessage as e:
            self.signer.stats.dropped_malformed += 1
            log.warning("%s dropped a malformed message: %s", self.name, e)
            return
        handler = m.handler_for(self.handlers(), message)
        if handler is None:
            self.signer.stats.dropped_malformed += 1  # a kind this role never takes
            log.warning("%s dropped an unexpected %s", self.name, message.kind)
            return
        handler(message)

    def handlers(self) -> dict:
        """This worker's dispatch table: message type -> handler."""
        return {m.Registered: self._on_registered, m.Refused: self._on_refused, m.Reregister: self._on_reregister}

    def _on_registered(self, _: m.Registered) -> None:
        self.registered = True
        log.info("%s registered with the router", self.name)

    def _on_refused(self, message: m.Refused) -> None:
        log.error("router refused %s: %s", self.name, message.reason)

    def _on_reregister(self, _: m.Reregister) -> None:
        # The router does not know us: it restarted, or declared us lost
        # and failed our requests. Either way no route is left for our
        # jobs and no finalize will come, so end them here (fail closed,
        # pages back once no write can land) before registering again.
        if self.registered:
            self.abandon_jobs()
        self.registered = False

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
