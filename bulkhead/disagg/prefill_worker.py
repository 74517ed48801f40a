"""The prefill worker: computes a prompt's KV, samples the first token, writes
the KV into the pages decode granted, and says what it wrote (the manifest).

Per request (a PrefillJob's phase, changed only through bulkhead.disagg.lifecycle):
    assign -> WAITING_POOL -(engine hand-over)-> PREFILLING, prefill_ready
    -(pages_granted from decode)-> TRANSFERRING: write pages, transfer_done
    -(writes ended)-> DONE, drain_ack
A finalize (abort) at any point stops the work (DRAINING); drain_ack is sent
once no write for the request can still land in decode's pool, and never
for a write that may still land (decode's lease fences it).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from bulkhead.faults import pause, wait_until
from bulkhead.protocol.lifecycle import Actor, Event, Phased
from bulkhead.protocol.manifest import Manifest
from bulkhead.protocol.types import Phase
from bulkhead.disagg.ticket import SignedTicket
from bulkhead.disagg.transfer import TransferError, make_source, page_digests
from bulkhead.disagg.wire import b64, logprobs_to_list, ticket_to_admitted
from bulkhead.disagg.worker_common import WorkerBase
from bulkhead.engine.outputs import RequestOutput

log = logging.getLogger(__name__)


@dataclass
class PrefillJob(Phased):
    actor = Actor.PREFILL
    ticket: SignedTicket
    phase: Phase | None = None  # None until assigned; then only through advance()
    result: RequestOutput | None = None  # the engine's hand-over (first token, held pages)
    grant: dict | None = None  # decode's pages_granted message
    granted_at: float = 0.0  # monotonic time the grant arrived


class PrefillWorker(WorkerBase):
    role = "prefill"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.jobs: dict[str, PrefillJob] = {}
        self.sources: dict[str, object] = {}  # transfer backend name -> TransferSource
        self.transfers = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bulkhead-transfer")

    def handle(self, kind: str, msg: dict) -> None:
        if kind == "assign":
            self._assign(SignedTicket.from_dict(msg["ticket"]))
        elif kind == "pages_granted":
            with self.lock:
                job = self.jobs.get(msg["request_id"])
                if job is None or job.phase in (Phase.DRAINING, Phase.DONE):  # never write after the outcome
                    return
                job.grant = msg
                job.granted_at = self.clock()
            self.faults.crash("crash_after_grant")
            self._maybe_transfer(msg["request_id"])
        elif kind == "finalize":
            self._finalize(msg["request_id"])

    def _assign(self, ticket: SignedTicket) -> None:
        if not self.accept_ticket(ticket, "prefill_failed"):
            return
        with self.lock:
            job = PrefillJob(ticket)
            job.advance(Event.ASSIGN)
            self.jobs[ticket.request_id] = job
        if self.faults.fire("stall_prefill"):  # the engine is busy: the request waits in its queue
            self.engine.call(pause)
        self.engine.submit(ticket_to_admitted(ticket), self._on_output)

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
                self.link.send({"kind": "prefill_ready", "request_id": rid})  # decode grants pages now
                self._maybe_transfer(rid)
        elif out.finished:  # aborted or failed before the hand-over: nothing was written
            if out.error is not None:
                self.link.send({"kind": "prefill_failed", "request_id": rid, "reason": out.error.message,
                                "code": out.error.code})
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
        if self.faults.fire("stall_past_grant"):
            pause(grant.get("write_within_s", 0) + 0.5)
        with self.lock:
            late = self.clock() - job.granted_at > grant.get("write_within_s", float("inf"))
            skip = job.phase is Phase.DRAINING or late
            if skip:
                # Decode has given up on (or will soon reuse) these pages: write nothing.
                self.count("transfers_skipped")
        if skip:
            if late and job.phase is not Phase.DRAINING:
                self.link.send({"kind": "transfer_failed", "request_id": rid,
                                "reason": "the grant expired before the transfer could start"})
            self.engine.call(lambda: self.engine.release_reserved(rid))
            self._drained(rid)
            return
        dst_pages, dst_gens = list(grant["pages"]), list(grant["generations"])
        src_pages = list(out.held_pages[: len(dst_pages)])
        drained = True
        try:
            source = self._source(grant["transfer"])
            # Guards off (benchmark only): no digests, and decode checks none.
            digests = page_digests(self.engine.pool, src_pages) if self.built.config.guards else [0] * len(src_pages)
            dst_pages, dst_gens, src_pages, digests = self._inject(dst_pages, dst_gens, src_pages, digests)
            self.faults.fire("slow_transfer")
            if self.faults.fire("stall_transfer"):  # until the router's deadline finalized the request
                wait_until(lambda: job.phase is Phase.DRAINING)
            source.write_pages(grant["transfer"]["descriptor"], rid, self.engine.pool, src_pages, dst_pages,
                               dst_gens)
            claimed = dst_pages
            if self.faults.fire("wrong_pages"):  # claims a page list decode did not grant
                claimed = dst_pages[:-1] + [dst_pages[-1] + 1]
            if self.faults.fire("corrupt_page"):  # bytes differ from what the digests describe
                self._corrupt(source, grant, rid, src_pages[0], dst_pages[0], dst_gens[0])
            self.faults.crash("crash_before_manifest")  # pages written, nothing said
            manifest = Manifest(rid, t.tenant, t.room, t.epoch, 0, len(t.prompt_token_ids), tuple(claimed),
                                tuple(dst_gens), tuple(digests))
            self.count("transfers")
            self.count("pages_sent", len(dst_pages))
            self.link.send({
                "kind": "transfer_done", "request_id": rid, "manifest": manifest.to_dict(),
                "first_token": out.token_ids[0], "first_logprobs": logprobs_to_list(out.logprobs),
                "sampler_state": b64(out.sampler_state),
            })
        except Exception as e:  # fail closed on anything, and say why
            drained = getattr(e, "drained", not isinstance(e, TransferError))
            self.count("transfers_failed")
            log.warning("transfer of %s failed: %r", rid, e, exc_info=not isinstance(e, TransferError))
            self.link.send({"kind": "transfer_failed", "request_id": rid, "reason": f"transfer failed: {e}"})
        finally:
            self.engine.call(lambda: self.engine.release_reserved(rid))
            if drained and not self.faults.fire("withhold_drain_ack"):
                self._drained(rid)
            else:  # not drained: no ack; decode holds the pages until the lease expires
                self._undrained(rid)

    def _inject(self, dst_pages, dst_gens, src_pages, digests):
        """Test-only faults that bend what prefill writes or claims (faults.py)."""
        if len(dst_pages) > 1 and self.faults.fire("short_transfer"):
            dst_pages, dst_gens, src_pages, digests = dst_pages[:-1], dst_gens[:-1], src_pages[:-1], digests[:-1]
        if self.faults.fire("stale_generation"):
            dst_gens = [g - 1 for g in dst_gens]
        return dst_pages, dst_gens, src_pages, digests

    def _corrupt(self, source, grant, rid, src_page, dst_page, dst_gen) -> None:
        pool = self.engine.pool
        saved = pool.data[src_page].clone()
        pool.data[src_page] += 1.0
        try:
            source.write_pages(grant["transfer"]["descriptor"], rid, pool, [src_page], [dst_page], [dst_gen])
        finally:
            pool.data[src_page] = saved

    def _source(self, transfer: dict):
        name = transfer["backend"]
        if name not in self.sources:
            self.sources[name] = make_source(name)
        return self.sources[name]

    def _finalize(self, rid: str) -> None:
        with self.lock:
            job = self.jobs.get(rid)
            if job is None:
                # Refused ticket or already drained: nothing was or will be
                # written, so decode may free its grant now, not at the lease.
                self.link.send({"kind": "drain_ack", "request_id": rid})
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
            self.engine.call(lambda: self.engine.release_reserved(rid))
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
                self.link.send({"kind": "drain_ack", "request_id": rid})

    def fail_closed(self, rid: str, reason: str) -> None:
        # The router fails the request (a typed 500) and finalizes it; the
        # finalize then drains the job as any other would.
        self.link.send({"kind": "prefill_failed", "request_id": rid, "reason": reason, "code": "internal_error"})
