"""The prefill worker: computes a prompt's KV, samples the first token, writes
the KV into the pages decode granted, and says what it wrote (the manifest).

Per request (a PrefillJob's phase, changed only through bulkhead.protocol.lifecycle):
    assign -> WAITING_POOL -(engine hand-over)-> PREFILLING, prefill_ready
    -(pages_granted from decode)-> TRANSFERRING: write pages, transfer_done
    -(writes ended)-> DONE, drain_ack
A finalize (abort) at any point stops the work (DRAINING); drain_ack is sent
once no write for the request can still land in decode's pool, and never
for a write that may still land (decode's lease fences it).

The handlers carry out the effects of bulkhead.protocol.prefill_job's transitions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bulkhead.disagg import messages as m
from bulkhead.protocol import prefill_job
from bulkhead.protocol.lifecycle import Actor, Phased
from bulkhead.protocol.manifest import Manifest
from bulkhead.protocol.transitions import Effect
from bulkhead.protocol.types import Phase
from bulkhead.protocol.ticket import Ticket
from bulkhead.disagg.transfer import TransferError, make_source, page_digests
from bulkhead.disagg.worker_common import WorkerBase
from bulkhead.engine.outputs import RequestOutput

log = logging.getLogger(__name__)


@dataclass
class PrefillJob(Phased):
    actor = Actor.PREFILL
    ticket: Ticket  # verified
    phase: Phase | None = None  # None until assigned; then only through prefill_job's transitions
    result: RequestOutput | None = None  # the engine's hand-over (first token, held pages)
    grant: m.PagesGranted | None = None  # decode's grant
    granted_at: float = 0.0  # monotonic time the grant arrived


class PrefillWorker(WorkerBase):
    role = "prefill"

    def __init__(self, *args, source_options: dict | None = None, **kwargs):
        """source_options: per transfer backend, how to build its source
        (mooncake: this host's address, and whether it may listen on more
        than loopback); a backend not named gets its defaults."""
        super().__init__(*args, **kwargs)
        self.source_options = source_options or {}
        self.jobs: dict[str, PrefillJob] = {}
        self.sources: dict[str, object] = {}  # transfer backend name -> TransferSource
        self.transfers = self.seams.make_transfer_executor()

    def handlers(self) -> dict:
        return super().handlers() | {m.Assign: self._on_assign, m.PagesGranted: self._on_pages_granted,
                                     m.Finalize: lambda message: self._finalize(message.request_id)}

    def _on_pages_granted(self, grant: m.PagesGranted) -> None:
        with self.lock:
            job = self.jobs.get(grant.request_id)
            # A job no longer here has ended (DONE); the grant follows our own
            # prefill_ready, so it never overtakes the ticket.
            step = prefill_job.pages_granted(job.phase if job else Phase.DONE, job is not None and job.grant is not None)
            if step.outcome == "late":  # never write after the outcome, nor twice
                return
            job.grant = grant
            job.granted_at = self.clock()
        self._maybe_transfer(grant.request_id)

    def _on_assign(self, message: m.Assign) -> None:
        ticket = self.accept_ticket(message.ticket, m.PrefillFailed)
        if ticket is None:
            return
        with self.lock:
            known = self.jobs.get(ticket.request_id)
            step = prefill_job.assign(known.phase if known else None, known is not None)
            if step.outcome == "duplicate":
                self.count("duplicate_tickets")
                return
            self.jobs[ticket.request_id] = PrefillJob(ticket, phase=step.phase)
        self.engine.submit(ticket.admitted, self._on_output)

    def _on_output(self, out: RequestOutput) -> None:  # engine thread
        rid = out.request_id
        if out.finish_reason == "prefilled":
            with self.failing_closed(rid):  # an illegal step skips the rest of the block
                with self.lock:
                    job = self.jobs.get(rid)
                    if job is not None:
                        job.result = out
                    step = prefill_job.prefilled(job.phase if job else None)
                    if job is not None:
                        job.take(step)
                if step.does(Effect.RELEASE_LOCAL):  # finalized while prefilling
                    self.engine.release_reserved(rid)  # we are on the engine thread
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
            if job is None:
                return
            step = prefill_job.start_transfer(job.phase, job.grant is not None)
            if not step.does(Effect.POST_WRITES):
                return
            job.take(step)
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
            source.write_pages(grant.transfer.descriptor, rid, self.engine.pool, src_pages, dst_pages,
                               dst_gens)
            manifest = Manifest(rid, t.tenant, t.room, t.epoch, 0, len(t.admitted.prompt_token_ids), tuple(dst_pages),
                                tuple(dst_gens), tuple(digests))
            self.count("transfers")
            self.count("pages_sent", len(dst_pages))
            self.send(m.TransferDone(rid, manifest, out.token_ids[0], out.logprobs, out.sampler_state,
                                     out.prompt_logprobs))
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

    def _source(self, transfer: m.Endpoint):
        name = transfer.backend
        if name not in self.sources:
            build = self.seams.make_source or make_source  # a harness's (bulkhead/seams.py), or disagg's own
            self.sources[name] = build(name, **self.source_options.get(name, {}))
        return self.sources[name]

    def _finalize(self, rid: str) -> None:
        with self.lock:
            job = self.jobs.get(rid)
            if job is None:
                # Refused ticket or already drained: nothing was or will be
                # written, so decode may free its grant now, not at the lease
                # (the outcome overtook the ticket, and nothing is outstanding).
                drained = prefill_job.quiesced(prefill_job.finalize(None).phase, runtime=True)
                if drained.does(Effect.SEND_DRAIN_ACK):
                    self.send(m.DrainAck(rid))
                return
            if job.phase is Phase.DONE:  # its write was not drained: never acked (decode's lease fences it)
                self.jobs.pop(rid)
                return
            holding = job.phase is Phase.PREFILLING
            step = job.take(prefill_job.finalize(job.phase))
        if step.outcome == "repeat":
            return  # the first finalize started the drain
        if not step.does(Effect.STOP_ENGINE):
            return  # transferring: the transfer thread acks when the write has ended
        self.engine.abort(rid)
        if holding:  # the KV is here and no write was posted: nothing is outstanding
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
            job.take(prefill_job.undrained(job.phase))  # DONE: no drain_ack for it, ever
            if finalized:
                self.jobs.pop(rid)

    def _drained(self, rid: str) -> None:
        with self.failing_closed(rid):  # an illegal step skips the rest of the block
            with self.lock:
                job = self.jobs.get(rid)
                if job is None:
                    return
                # DONE: undrained, never acked
                step = job.take(prefill_job.quiesced(job.phase, runtime=True))
                self.jobs.pop(rid)
            if step.does(Effect.SEND_DRAIN_ACK):
                self.send(m.DrainAck(rid))

    def fail_closed(self, rid: str, reason: str) -> None:
        # The router fails the request (a typed 500) and finalizes it; the
        # finalize then drains the job as any other would.
        self.send(m.PrefillFailed(rid, reason, "internal_error"))
