"""The prefill worker: computes a prompt's KV, samples the first token, writes
the KV into the pages decode granted, and says what it wrote (the manifest).

Per request (a PrefillJob's phase, changed only through bulkhead.protocol.lifecycle):
    assign -> WAITING_POOL -(engine hand-over)-> PREFILLING, prefill_ready
    -(pages_granted from decode)-> TRANSFERRING: write pages, transfer_done
    -(writes ended)-> DONE, drain_ack
A finalize (abort) at any point stops the work (DRAINING); drain_ack is sent
once no write for the request can still land in decode's pool, and never
for a write that may still land (decode's lease fences it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bulkhead.disagg import messages as m
from bulkhead.protocol.lifecycle import Actor, Event, Phased
from bulkhead.protocol.manifest import Manifest
from bulkhead.protocol.types import Phase
from bulkhead.disagg.ticket import SignedTicket
from bulkhead.disagg.transfer import TransferError, page_digests
from bulkhead.disagg.worker_common import WorkerBase
from bulkhead.engine.outputs import RequestOutput

log = logging.getLogger(__name__)


@dataclass
class PrefillJob(Phased):
    actor = Actor.PREFILL
    ticket: SignedTicket
    phase: Phase | None = None  # None until assigned; then only through advance()
    result: RequestOutput | None = None  # the engine's hand-over (first token, held pages)
    grant: m.PagesGranted | None = None  # decode's grant
    granted_at: float = 0.0  # monotonic time the grant arrived


class PrefillWorker(WorkerBase):
    role = "prefill"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.jobs: dict[str, PrefillJob] = {}
        self.sources: dict[str, object] = {}  # transfer backend name -> TransferSource
        self.transfers = self.seams.make_transfer_executor()

    def handlers(self) -> dict:
        return super().handlers() | {m.Assign: self._on_assign, m.PagesGranted: self._on_pages_granted,
                                     m.Finalize: lambda message: self._finalize(message.request_id)}

    def _on_pages_granted(self, grant: m.PagesGranted) -> None:
        with self.lock:
            job = self.jobs.get(grant.request_id)
            if job is None or job.phase in (Phase.DRAINING, Phase.DONE):  # never write after the outcome
                return
            job.grant = grant
            job.granted_at = self.clock()
        self._maybe_transfer(grant.request_id)

    def _on_assign(self, message: m.Assign) -> None:
        ticket = message.ticket
        if not self.accept_ticket(ticket, m.PrefillFailed):
            return
        with self.lock:
            job = PrefillJob(ticket)
            job.advance(Event.ASSIGN)
            self.jobs[ticket.request_id] = job
        self.engine.submit(ticket.admitted, self._on_output)

    def _on_output(self, out: RequestOutput) -> None:  # engine thread
        rid = out.request_id
        if out.finish_reason == "prefilled":
            with self.failing_closed(rid):  # an illegal step skips the rest of the block
                with self.lock:
                    job = self.jobs.get(rid)
                    if job is not None:
                        job.result = out
                    finalized = job is None or job.phase is Phase.DRAINING
                    if not finalized:
                        job.advance(Event.PREFILLED)
                if finalized:
                    self.engine.release_reserved(rid)  # aborted while prefilling: we are on the engine thread
                    self._drained(rid)
                    return
                self.send(m.PrefillReady(rid))  # decode grants pages now
                self._maybe_transfer(rid)
        elif out.finished:  # aborted or failed before the hand-over: nothing was written
            if out.error is not None:
                self.send(m.PrefillFailed(rid, out.error.message, out.error.code))
            self._drained(rid)

    def _maybe_transfer(self, rid: str) -> None:
        with self.lock:
            job = self.jobs.get(rid)
            if job is None or job.phase is not Phase.PREFILLING or job.grant is None:
                return
            job.advance(Event.PAGES_GRANTED)
        self.transfers.submit(self._transfer, job)

    def _transfer(self, job: PrefillJob) -> None:
        t, out, grant = job.ticket, job.result, job.grant
        rid = t.request_id
        with self.lock:
            late = self.clock() - job.granted_at > grant.write_within_s
            skip = job.phase is Phase.DRAINING or late
            if skip:
                # Decode has given up on (or will soon reuse) these pages: write nothing.
                self.count("transfers_skipped")
        if skip:
            if late and job.phase is not Phase.DRAINING:
                self.send(m.TransferFailed(rid, "the grant expired before the transfer could start"))
            self.engine.release_reserved_pages(rid)
            self._drained(rid)
            return
        dst_pages, dst_gens = list(grant.pages), list(grant.generations)
        src_pages = list(out.held_pages[: len(dst_pages)])
        drained = True
        try:
            source = self._source(grant.transfer)
            # Guards off (benchmark only): no digests, and decode checks none.
            digests = page_digests(self.engine.pool, src_pages) if self.built.config.guards else [0] * len(src_pages)
            source.write_pages(grant.transfer["descriptor"], rid, self.engine.pool, src_pages, dst_pages,
                               dst_gens)
            manifest = Manifest(rid, t.tenant, t.room, t.epoch, 0, len(t.prompt_token_ids), tuple(dst_pages),
                                tuple(dst_gens), tuple(digests))
            self.count("transfers")
            self.count("pages_sent", len(dst_pages))
            self.send(m.TransferDone(rid, manifest, out.token_ids[0], out.logprobs, out.sampler_state))
            if self.lineage.enabled:
                self.lineage.transferred(rid, t.tenant, src_pages, dst_pages, dst_gens, manifest.digest())
        except Exception as e:  # fail closed on anything, and say why
            drained = getattr(e, "drained", not isinstance(e, TransferError))
            self.count("transfers_failed")
            log.warning("transfer of %s failed: %r", rid, e, exc_info=not isinstance(e, TransferError))
            self.send(m.TransferFailed(rid, f"transfer failed: {e}"))
        finally:
            self.engine.release_reserved_pages(rid)
            if drained:
                self._drained(rid)
            else:  # not drained: no ack; decode holds the pages until the lease expires
                self._undrained(rid)

    def _source(self, transfer: dict):
        name = transfer["backend"]
        if name not in self.sources:
            self.sources[name] = self.seams.make_source(name)
        return self.sources[name]

    def _finalize(self, rid: str) -> None:
        with self.lock:
            job = self.jobs.get(rid)
            if job is None:
                # Refused ticket or already drained: nothing was or will be
                # written, so decode may free its grant now, not at the lease.
                self.send(m.DrainAck(rid))
                return
            if job.phase is Phase.DONE:  # its write was not drained: never acked (decode's lease fences it)
                self.jobs.pop(rid)
                return
            if job.phase is Phase.DRAINING:  # a repeat: the first finalize started the drain
                return
            busy = job.phase is Phase.TRANSFERRING
            holding = job.phase is Phase.PREFILLING
            job.advance(Event.FINALIZE)
        if busy:
            return  # the transfer thread acks when the write has ended
        self.engine.abort(rid)
        if holding:
            self.engine.release_reserved_pages(rid)
            self._drained(rid)
        # Still prefilling: the engine's abort output (or its hand-over) acks.

    def _undrained(self, rid: str) -> None:
        """A write that may still land is never acked; the job is forgotten once
        the router has finalized the request (found by the simulator: the job
        used to stay in `jobs` forever after every undrained failure)."""
        with self.failing_closed(rid), self.lock:
            job = self.jobs.get(rid)
            if job is None:
                return
            finalized = job.phase is Phase.DRAINING
            job.advance(Event.UNDRAINED)  # DONE: no drain_ack for it, ever
            if finalized:
                self.jobs.pop(rid)

    def _drained(self, rid: str) -> None:
        with self.failing_closed(rid):  # an illegal step skips the rest of the block
            with self.lock:
                job = self.jobs.get(rid)
                if job is None:
                    return
                ack = job.phase is not Phase.DONE  # DONE: undrained, never acked
                if ack:
                    job.advance(Event.QUIESCED)
                self.jobs.pop(rid)
            if ack:
                self.send(m.DrainAck(rid))

    def fail_closed(self, rid: str, reason: str) -> None:
        # The router fails the request (a typed 500) and finalizes it; the
        # finalize then drains the job as any other would.
        self.send(m.PrefillFailed(rid, reason, "internal_error"))
