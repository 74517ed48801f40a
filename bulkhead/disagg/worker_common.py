"""What the prefill and decode workers share: registration and heartbeats."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from bulkhead.disagg.engine_channel import EngineChannel
from bulkhead.disagg.signing import Signer
from bulkhead.disagg import messages as m
from bulkhead.disagg.ticket import TicketError, verify
from bulkhead.disagg.zmq_links import WorkerLink
from bulkhead.engine.builder import BuiltEngine
from bulkhead.protocol.lifecycle import IllegalTransition
from bulkhead.protocol.ticket import SignedTicket, Ticket
from bulkhead.seams import PRODUCTION, Seams
from bulkhead.serving.info import engine_info

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.5
# A leaving worker that holds nothing waits this long for the router's Drain
# (after which no assign can come) before it goes anyway (no router left).
UNANSWERED_LEAVE_S = 5.0


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
        self.link = (seams.make_link or WorkerLink)(signer, router_address)
        self.lock = threading.Lock()  # guards the per-request job tables
        self.registered = False
        # Draining: the router sends no new request after its Drain. Leaving
        # (SIGTERM): drain, then stop once nothing is held or at leave_by.
        self.draining = False
        self.leave_by: float | None = None
        self._leave_announced: float | None = None  # when Leaving was sent
        self._left = False
        self.counters: dict[str, int] = {}
        self._last_beat = 0.0
        # The only way to the engine thread: commands (each tenant's weight and
        # KV share from its verified tickets; the fair queue's figures back).
        self.channel = EngineChannel(self.engine)

    def send(self, message) -> None:
        """One typed message to the router (bulkhead/disagg/messages.py)."""
        self.link.send(m.encode(message))

    def accept_ticket(self, signed: SignedTicket, refusal: type) -> Ticket | None:
        """The assigned ticket, once verified (signature, and this worker's
        own limits: a re-check, never a new decision); None when refused, and
        the refusal fails the request."""
        self.count("assigned")
        try:
            ticket = verify(signed, self.key, self.built.limits.context_length)
        except TicketError as e:
            self.count("tickets_refused")
            self.send(refusal(signed.request_id, str(e)))
            return None
        self.channel.tell_share(ticket.tenant, ticket.weight, ticket.kv_share)  # in force before its request
        if ticket.admitted.client_id is not None:
            self.lineage.named(ticket.request_id, ticket.tenant, ticket.admitted.client_id)
        if ticket.admitted.adapter is not None:  # before decode's grant: every allocation is recorded with it
            a = ticket.admitted.adapter
            self.lineage.adapter(ticket.request_id, ticket.tenant, a.name, a.digest)
        return ticket

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
        """Its /server_info body, sent with every heartbeat; `tenants` is the
        scheduler's per-tenant service, queue and pages (operators only), as
        the engine thread last published them (EngineChannel)."""
        with self.lock:  # jobs by protocol phase: /dashboard's transfers in flight
            phases = [job.phase.value for job in self.jobs.values() if job.phase is not None]
        return engine_info(self.built, self.model_id, self.role) | {
            "name": self.name, "tenants": dict(self.channel.latest.tenants),
            "jobs_by_phase": {p: phases.count(p) for p in sorted(set(phases))},
            "draining": self.draining, "drained": self.draining and self.holds_nothing()}

    def holds_nothing(self) -> bool:
        """No job in any phase: nothing computing, moving or waiting for an ack or a lease."""
        with self.lock:
            return not self.jobs

    # -- drain and leave ----------------------------------------------------------------
    def leave(self, deadline_s: float) -> None:
        """SIGTERM: ask the router to drain us, finish what we hold, then
        stop (at the latest after deadline_s). A second call stops now.
        Runs in a signal handler: it only sets state; the tick acts."""
        if self.leave_by is not None:
            self.stop()
            return
        self.leave_by = self.clock() + deadline_s

    def _leave_tick(self, now: float) -> None:
        if self.leave_by is None or self._left:
            return
        if not self.registered:  # no router to drain us: nothing can be assigned
            log.info("%s leaving (not registered)", self.name)
            self._go()
        elif self._leave_announced is None:
            self._leave_announced = now
            self.send(m.Leaving())
        elif self.draining and self.holds_nothing():
            log.info("%s drained: leaving", self.name)
            self.send(self.heartbeat())  # the router sees it drained before it goes
            self._go()
        elif not self.draining and now - self._leave_announced > UNANSWERED_LEAVE_S and self.holds_nothing():
            log.warning("%s: the router did not answer Leaving; holding nothing, leaving", self.name)
            self._go()
        elif now > self.leave_by:
            with self.lock:
                held = len(self.jobs)
            self.count("drain_deadline_passed")
            log.error("%s drain deadline passed with %d requests held: leaving anyway", self.name, held)
            self._go()

    def _go(self) -> None:
        self._left = True
        self.stop()

    def _on_drain(self, _: m.Drain) -> None:
        # The router queued this after its last assign to us: none follows.
        self.draining = True
        log.info("%s draining", self.name)

    def _on_resume(self, _: m.Resume) -> None:
        if self.leave_by is None:  # a leaving worker leaves
            self.draining = False
            log.info("%s resumed", self.name)

    def transfer_endpoint(self) -> dict | None:
        """Where writers reach this worker's pool (decode), sent with Register."""
        return None

    def heartbeat(self) -> m.Heartbeat:
        counters = dict(self.counters) | self.channel.latest.prefix_cache
        lineage = self.lineage.stats()
        if lineage is not None:
            counters |= {f"lineage_{k}": v for k, v in lineage.items() if isinstance(v, int)}
        counters |= self.seams.counters()
        return m.Heartbeat(self.info(), counters, vars(self.signer.stats).copy())

    def on_tick(self) -> None:
        self.channel.refresh()  # for the next heartbeat and grant order
        now = self.clock()
        if now - self._last_beat >= HEARTBEAT_S:
            self._last_beat = now
            if not self.registered:
                self.send(m.Register(self.info(), self.transfer_endpoint()))
            self.send(self.heartbeat())
        self._leave_tick(now)

    def on_message(self, body: dict) -> None:  # link thread
        try:
            message = m.decode(body)
        except m.MalformedMessage as e:
            self.signer.stats.dropped_malformed += 1
            log.warning("%s dropped a malformed message: %s", self.name, e)
            return
        handler = self.handlers().get(type(message))
        if handler is None:
            self.signer.stats.dropped_malformed += 1  # a kind this role never takes
            log.warning("%s dropped an unexpected %s", self.name, message.kind)
            return
        handler(message)

    def handlers(self) -> dict:  # message type -> handler
        return {m.Registered: self._on_registered, m.Refused: self._on_refused, m.Reregister: self._on_reregister,
                m.Drain: self._on_drain, m.Resume: self._on_resume}

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
        self.draining = False  # a new router knows nothing of a drain (a leaving worker stops: not registered)

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
