"""The decode worker: grants pages for an admitted prompt, verifies what
prefill wrote into them, and only then decodes.

Per request (a DecodeJob's phase, changed only through bulkhead.protocol.lifecycle):
    assign -> WAITING_PAGES -(prefill_ready, pages reserved)-> DECODE_ALLOCATED
    transfer_done -> coverage check (manifest == allocation, generations
                     unchanged, every digest verifies) -> COMMITTED -> DECODING -> outputs
    anything else (transfer_failed, finalize, bad manifest, a step the table
    does not have) -> fail closed: DRAINING, and the pages are released only
    after prefill's drain_ack or the lease.

The handlers carry out the effects of bulkhead.protocol.decode_job's transitions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bulkhead.disagg import messages as m
from bulkhead.protocol import decode_job
from bulkhead.protocol.lifecycle import Actor, Phased
from bulkhead.protocol.manifest import Allocation, coverage_problems, write_admissible
from bulkhead.protocol.transitions import Effect
from bulkhead.protocol.types import Phase
from bulkhead.protocol.ticket import Ticket
from bulkhead.disagg.worker_common import WorkerBase
from bulkhead.engine.outputs import RequestOutput

log = logging.getLogger(__name__)

# How long a finalized allocation waits for prefill's drain ack before its
# pages are reused anyway. Longer than any transfer's own timeout, so a
# writer that never acked has given up writing by then (the fence).
DRAIN_LEASE_S = 30.0
# A grant that waits for pages is retried this often, at a tick (ticks come
# every zmq_links.TICK_S): the pool frees pages per engine step, not per tick.
GRANT_RETRY_S = 0.05


@dataclass
class DecodeJob(Phased):
    actor = Actor.DECODE
    ticket: Ticket  # verified
    phase: Phase | None = None  # None until assigned; then only through decode_job's transitions
    alloc: Allocation | None = None
    manifest_seen: bool = False  # a manifest is checked once
    # Prefill's drain ack: no write of its can still land. Not a phase: it
    # may come in any phase (prefill acks as soon as its writes end, usually
    # before the commit), and matters once the job is DRAINING.
    drained: bool = False
    lease_deadline: float | None = None
    grant_deadline: float | None = None  # uncommitted past this: fail (no manifest is coming)


class DecodeWorker(WorkerBase):
    role = "decode"

    def __init__(self, *args, target, drain_lease_s: float = DRAIN_LEASE_S, **kwargs):
        super().__init__(*args, **kwargs)
        self.target = target  # the transfer backend's decode side; the engine's pool lives in it
        self.drain_lease_s = drain_lease_s
        self.jobs: dict[str, DecodeJob] = {}
        self.pending: list[str] = []  # assigned, waiting for free pages
        # Backends that see each write (tcp) refuse one unless the page is
        # still the request's at the granted generation; pages change hands
        # only under target.write_lock, so the check cannot go stale mid-write.
        target.set_write_guard(self._write_allowed)
        self.engine.page_lock = target.write_lock
        self._last_grant_try = 0.0

    def transfer_endpoint(self) -> dict:
        return {"backend": self.target.name, "descriptor": self.target.descriptor()}

    # -- messages (link thread) ---------------------------------------------
    def handlers(self) -> dict:
        return super().handlers() | {
            m.Assign: self._on_assign, m.PrefillReady: self._on_prefill_ready,
            m.TransferDone: self._verify_and_commit, m.DrainAck: self._on_drain_ack,
            m.Finalize: lambda message: self._finalize(message.request_id),
        }

    def _on_prefill_ready(self, message: m.PrefillReady) -> None:
        # Pages are granted only once the KV exists, so the writer starts
        # within moments of the grant (and never after write_within_s).
        rid = message.request_id
        with self.lock:
            job = self.jobs.get(rid)
            wants = decode_job.wants_pages(job.phase if job else None).does(Effect.RESERVE_PAGES)
            if wants and rid not in self.pending:
                self.pending.append(rid)
        self._grant_pending()

    def _on_drain_ack(self, message: m.DrainAck) -> None:
        rid = message.request_id
        with self.lock:
            job = self.jobs.get(rid)
            step = decode_job.drain_ack(job.phase if job else None)
            if step.does(Effect.MARK_DRAINED):
                job.drained = True  # the outcome will free the pages at once
            elif step.does(Effect.RELEASE_PAGES):
                job.take(step)
                self.jobs.pop(rid)
        if step.does(Effect.RELEASE_PAGES):
            self.engine.release_reserved_pages(rid)

    def _on_assign(self, message: m.Assign) -> None:
        ticket = self.accept_ticket(message.ticket, m.TransferFailed)
        if ticket is None:
            return
        with self.lock:
            known = self.jobs.get(ticket.request_id)
            step = decode_job.assign(known.phase if known else None)
            if step.outcome == "duplicate":
                self.count("duplicate_tickets")
                return
            self.jobs[ticket.request_id] = DecodeJob(ticket, phase=step.phase)

    def _grant_pending(self) -> None:
        with self.lock:
            waiting = self._fair_order(self.pending)
        for rid in waiting:
            job = self.jobs.get(rid)
            if not decode_job.wants_pages(job.phase if job else None).does(Effect.RESERVE_PAGES):
                with self.lock:
                    self.pending.remove(rid)
                continue
            n = self.built.layout.pages_for_tokens(len(job.ticket.admitted.prompt_token_ids))
            future = self.engine.reserve_pages(rid, job.ticket.tenant, n)
            future.add_done_callback(lambda f, rid=rid: self._granted(rid, f))
            with self.lock:
                self.pending.remove(rid)

    def _fair_order(self, rids: list[str]) -> list[str]:
        """Pages go first to the tenant the engine's fair queue has served
        least (its virtual counter, weighted by the ticket's share), in
        arrival order within a tenant: under a full pool a heavy tenant's
        backlog of grants does not hold a light tenant's first one back. The
        counters are the engine thread's copy (EngineChannel), a tick old at most."""
        counters = self.channel.latest.service
        tenant_of = {rid: job.ticket.tenant for rid in rids if (job := self.jobs.get(rid)) is not None}
        return sorted(rids, key=lambda rid: counters.get(tenant_of.get(rid, ""), 0.0))

    def _write_allowed(self, page: int, generation: int, request_id: str) -> bool:
        # Only while the request still waits for its KV, even at an unchanged
        # owner and generation: a late or duplicated write after commit would
        # overwrite verified KV (TLA+ found it). The rule is the one the model
        # checker explores (manifest.write_admissible).
        with self.lock:
            job = self.jobs.get(request_id)
            awaiting = job is not None and job.phase is Phase.DECODE_ALLOCATED
        ledger = self.engine.ledger
        page_now = (ledger.record(page).owner, ledger.generation(page)) if awaiting else None
        return write_admissible((request_id, generation), page_now, awaiting)

    def _granted(self, rid: str, future) -> None:  # engine thread
        try:
            result = future.result()
        except ValueError as e:  # the scheduler refused a second reservation for one request
            self.count("illegal_transitions")
            log.error("%s failing %s closed: %s", self.name, rid, e)
            self._fail(rid, "kv_transfer_failed", f"a second page reservation was refused ({e})")
            return
        with self.failing_closed(rid):  # an illegal step skips the rest of the block
            with self.lock:
                job = self.jobs.get(rid)
                if result is None:  # pool busy: try again on a later tick
                    self.count("grants_deferred")  # the pool-exhaustion signal (fault matrix)
                    if job is not None:
                        self.pending.append(rid)
                    return
                step = decode_job.pages_reserved(job.phase if job else None)
                if step.does(Effect.RETURN_PAGES):
                    # Finalized before its grant: give the pages straight back
                    # (no writer was ever told of them). A second reservation
                    # for one request never gets here: the scheduler refuses it.
                    self.engine.release_reserved_pages(rid)
                    return
                job.take(step)
                pages, gens = result
                t = job.ticket
                job.alloc = Allocation(rid, t.tenant, t.room, t.epoch, len(t.admitted.prompt_token_ids), tuple(pages),
                                       tuple(gens))
                # A backstop only: the router's lost-worker detection and deadline act first.
                job.grant_deadline = self.clock() + 4 * self.drain_lease_s
            self.count("pages_granted", len(pages))
            if self.lineage.enabled:
                self.lineage.granted(rid, t.tenant, t.room, t.epoch, pages, gens)
            # write_within_s: prefill starts no write for this grant after it, so a
            # writer that never acks is done writing long before the lease ends.
            self.send(m.PagesGranted(rid, t.room, t.epoch, tuple(pages), tuple(gens),
                                     m.Endpoint(**self.transfer_endpoint()), write_within_s=self.drain_lease_s / 3))

    def _verify_and_commit(self, done: m.TransferDone) -> None:
        rid = done.request_id
        with self.lock:
            job = self.jobs.get(rid)
            step = decode_job.manifest_arrived(job.phase if job else None, job is not None and job.manifest_seen)
            if step.does(Effect.CHECK_KV):
                job.manifest_seen = True
        if not step.does(Effect.CHECK_KV):  # late, or a duplicate
            self.count("manifests_unexpected")
            return
        # The pages are read on the engine thread, where the pool and the
        # ledger live; the link thread must not wait for it (heartbeats and
        # outputs go through the link thread). Guards off (benchmark only):
        # no digests are computed and the manifest's are taken as they come.
        future = self.engine.read_pages(rid, job.alloc.pages, digests=self.built.config.guards)
        future.add_done_callback(lambda f: self._checked(rid, job, done, f))

    def _checked(self, rid: str, job: DecodeJob, done: m.TransferDone, future) -> None:
        try:
            facts = future.result()
            local = facts.digests if facts.digests is not None else done.manifest.digests
            problems = coverage_problems(job.alloc, done.manifest, facts.generations, local)
            if any(owner != rid for owner in facts.owners):
                problems.append("a granted page is no longer owned by the request")
        except Exception as e:  # fail closed on a check that could not run
            problems = [f"verification failed: {e!r}"]
        if problems:
            if self.lineage.enabled:
                self.lineage.refused(rid, job.ticket.tenant, "; ".join(problems), done.manifest.digest())
            self.count("coverage_failures")
            log.warning("refusing KV for %s: %s", rid, "; ".join(problems))
            self._fail(rid, "kv_transfer_failed", "the transferred KV did not verify: " + "; ".join(problems))
            return
        with self.failing_closed(rid):  # an illegal step skips the rest of the block
            with self.lock:
                step = decode_job.verdict(job.phase, lambda: "")
                if not step.does(Effect.COMMIT):  # finalized while the check ran
                    return
                job.take(step)
            self.count("commits")
            if self.lineage.enabled:
                self.lineage.committed(rid, job.ticket.tenant, job.alloc.pages, job.alloc.generations,
                                       done.manifest.digest())
            lp = done.first_logprobs
            self.engine.submit_prefilled(job.ticket.admitted, done.first_token, lp[0] if lp else None,
                                         done.sampler_state, self._on_output, done.prompt_logprobs)

    def _on_output(self, out: RequestOutput) -> None:  # engine thread
        self.send(m.Output(out))
        rid = out.request_id
        with self.failing_closed(rid), self.lock:
            job = self.jobs.get(rid)
            if job is None:
                return
            if out.finished:  # the engine has freed the pages
                job.take(decode_job.finished(job.phase))
                self.jobs.pop(rid)
            else:
                job.take(decode_job.decode_step(job.phase))

    def _fail(self, rid: str, code: str, reason: str) -> None:
        """Give up on the request's KV and tell the router. An allocation
        drains at once (pages back after the drain ack or the lease); in any
        other phase the router's finalize, which the report brings, ends the
        job through the table. Also the fail-closed path of an illegal
        transition, so it takes no step the table could refuse."""
        with self.lock:
            job = self.jobs.get(rid)
            if job is None:
                return
            if job.take(decode_job.verdict(job.phase, lambda: reason)).does(Effect.MARK_FAILED):
                job.lease_deadline = self.clock() + self.drain_lease_s
        self.send(m.TransferFailed(rid, reason, code))
        self._release_if_remembered_ack(rid)

    def fail_closed(self, rid: str, reason: str) -> None:
        self._fail(rid, "kv_transfer_failed", reason)

    def _finalize(self, rid: str) -> None:
        with self.lock:
            job = self.jobs.get(rid)
            if job is None:
                return
            # A repeat changes nothing (after our own failure, say).
            step = job.take(decode_job.finalize(job.phase, job.drained))
            if step.does(Effect.START_LEASE):
                job.lease_deadline = self.clock() + self.drain_lease_s
            elif step.does(Effect.RELEASE_PAGES):
                self.jobs.pop(rid)
        if step.does(Effect.ABORT_ENGINE):
            # Not a phase change: the engine owns a committed request's pages
            # and ends it; its last output is FINISHED. No drain wait, since
            # no write is admitted after the commit (_write_allowed).
            self.engine.abort(rid)
        elif step.does(Effect.RELEASE_PAGES):
            self.engine.release_reserved_pages(rid)

    def _release_if_remembered_ack(self, rid: str) -> None:
        """A job that drains after prefill's ack already came (a failed
        check): the remembered ack frees the pages now."""
        with self.lock:
            job = self.jobs.get(rid)
            if job is None or not job.drained:
                return
            step = job.take(decode_job.drain_ack(job.phase))
            if step.does(Effect.RELEASE_PAGES):
                self.jobs.pop(rid)
        if step.does(Effect.RELEASE_PAGES):
            self.engine.release_reserved_pages(rid)

    def _lease_expired(self, rid: str) -> None:
        """The fence: no write admitted for this grant can land after it."""
        with self.lock:
            job = self.jobs.get(rid)
            step = decode_job.lease_expired(job.phase if job else None)
            if step.does(Effect.RELEASE_PAGES):
                job.take(step)
                self.jobs.pop(rid)
        if step.does(Effect.RELEASE_PAGES):
            self.count("lease_expiries")
            self.engine.release_reserved_pages(rid)

    def on_tick(self) -> None:
        super().on_tick()
        now = self.clock()
        if self.pending and now - self._last_grant_try >= GRANT_RETRY_S:
            self._last_grant_try = now
            self._grant_pending()
        with self.lock:
            expired = [rid for rid, j in self.jobs.items()
                       if j.phase is Phase.DRAINING and not j.drained and j.lease_deadline is not None
                       and now > j.lease_deadline]
            stalled = [rid for rid, j in self.jobs.items()
                       if j.phase is Phase.DECODE_ALLOCATED and j.grant_deadline is not None and now > j.grant_deadline]
        for rid in expired:
            self._lease_expired(rid)
        for rid in stalled:  # granted, but no manifest ever came: fail closed
            self._fail(rid, "kv_transfer_failed", "no transfer arrived for the granted pages")
