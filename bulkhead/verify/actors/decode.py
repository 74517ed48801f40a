"""The decode worker's half of the protocol: allocate pages for a ticket,
admit writes against the ledger, commit only on exact, verified coverage,
decode, and free pages only when no writer can still reach them. Its
decisions are decode_job.py's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from bulkhead.protocol import decode_job
from bulkhead.protocol.decode_job import WAIT
from bulkhead.protocol.manifest import Allocation, Manifest, identity_problems, mismatched_pages, write_admissible
from bulkhead.protocol.messages import (
    Assign, DrainAck, Endpoint, Finalize, Output, PagesGranted, TransferDone, TransferFailed,
)
from bulkhead.protocol.outputs import RequestOutput
from bulkhead.protocol.ticket import Ticket
from bulkhead.protocol.transitions import Effect
from bulkhead.protocol.types import Outcome, Phase
from bulkhead.verify.actors.config import ProtocolConfig, Variant
from bulkhead.verify.actors.events import Committed, DecodeStep, LeaseExpired, PageRead, Reserved, Step, WriteLanded
from bulkhead.verify.actors.ledger_model import Ledger
from bulkhead.verify.actors.network import Envelope, Landing, PageWrite, dispatch
from bulkhead.verify.actors.values import (
    MODEL_MAC, ROUTER, cached_hash, decode_addr, digest_of, find, kv_origin, prefill_addr, put,
)


@cached_hash
@dataclass(frozen=True)
class DecodeRequest:
    rid: int
    phase: Phase | None                # WAITING_PAGES .. DECODING, DRAINING, DONE (lifecycle.py);
                                       # None only inside a step, until the table gives one
    ticket: Ticket | None = None       # verified: the signature is off
    pages: tuple[int, ...] = ()        # prompt pages first, then decode pages
    manifest: Manifest | None = None
    drain_acked: bool = False          # prefill's ack came before our Finalize
    reserving: bool = False            # pages reserved on the engine; the job has not heard yet
    outcome: Outcome | None = None     # the router's Finalize; on a committed record: the engine ends it

    @property
    def prompt_pages(self) -> tuple[int, ...]:
        return self.pages[:self.ticket.admitted.prompt_pages] if self.ticket else ()


@cached_hash
@dataclass(frozen=True)
class DecodeState:
    index: int
    ledger: Ledger
    incarnation: int = 1
    requests: tuple[DecodeRequest, ...] = ()


def decode_initial(config: ProtocolConfig, index: int) -> DecodeState:
    return DecodeState(index, Ledger.fresh(config.decode_pools[index]))


def decode_restart(config: ProtocolConfig, state: DecodeState) -> DecodeState:
    """A crash and restart: requests and ownership are gone, memory is not."""
    ledger = state.ledger.restarted(scrub=config.guards.scrub_on_free)
    return DecodeState(state.index, ledger, state.incarnation + 1)


def decode_step(config: ProtocolConfig, state: DecodeState, event) -> Step:
    return dispatch(config, state, event, _HANDLERS, "decode")


def _assign(config, state: DecodeState, message: Assign) -> Step:
    if message.ticket.mac != MODEL_MAC and config.guards.hmac:
        return Step(state)
    ticket = message.ticket.ticket
    known = find(state.requests, ticket.request_id)
    step = decode_job.assign(known.phase if known else None)
    if step.outcome == "duplicate" or ticket.decode_incarnation != state.incarnation:
        return Step(state)  # a duplicate; or issued before our restart (the router will learn of it)
    record = DecodeRequest(ticket.request_id, step.phase, ticket=ticket)
    return _allocate_waiting(config, put(state, record))


def _allocate_waiting(config, state: DecodeState) -> Step:
    """Reserve pages for waiting tickets in rid order while the pool has
    room: the engine takes them now (owned by the request), and the job
    hears of it in a step of its own (Reserved), which an outcome may
    overtake. REAL trusts the ticket: admission already proved the request fits."""
    for record in state.requests:
        if record.reserving or not decode_job.wants_pages(record.phase).does(Effect.RESERVE_PAGES):
            continue
        need = record.ticket.admitted.total_pages
        if need > len(state.ledger.free):
            continue
        ledger, pages = state.ledger.allocate(record.rid, need)
        record = replace(record, pages=pages, reserving=True)
        state = put(replace(state, ledger=ledger), record)
    return Step(state)


def _reserved(config, state: DecodeState, event: Reserved) -> Step:
    """The reservation reaches the job: granted (and told to the writer)
    while the request still waits for pages; after its outcome the pages go
    straight back (no writer was ever told of them). A drain that ended
    first has freed them already, and the record no longer waits for this
    (the runtime's engine runs a release queued behind the reservation
    after it; the callback then finds no job)."""
    record = find(state.requests, event.rid)
    step = decode_job.pages_reserved(record.phase)
    record = replace(record, phase=step.phase, reserving=False)
    if step.does(Effect.RETURN_PAGES):
        ledger = state.ledger.release(record.pages, scrub=config.guards.scrub_on_free)
        record = replace(record, pages=())
        return _allocate_waiting(config, put(replace(state, ledger=ledger), record))
    state = put(state, record)
    ticket, ledger = record.ticket, state.ledger
    pages = record.prompt_pages
    grant = PagesGranted(ticket.request_id, ticket.room, ticket.epoch, pages,
                         tuple(ledger.entries[p].gen for p in pages),
                         Endpoint("model", (state.index, state.incarnation)), write_within_s=float("inf"))
    return Step(state, (Envelope(prefill_addr(ticket.admitted.prefill), grant),))


def _admit_write(config, state: DecodeState, write: PageWrite) -> Step:
    """The transfer engine admits a write against the ledger. Once admitted
    the DMA cannot be stopped: it becomes a Landing."""
    if not 0 <= write.page < len(state.ledger.entries):
        return Step(state)
    entry = state.ledger.entries[write.page]
    if config.guards.generation_check:
        record = find(state.requests, write.request_id)
        awaiting = record is not None and record.phase is Phase.DECODE_ALLOCATED
        if not write_admissible((write.incarnation, write.request_id, write.gen),
                                (state.incarnation, entry.owner, entry.gen), awaiting):
            return Step(state)  # stale (the page moved on, or this process is new) or late
    landing = Landing(write.request_id, write.epoch, state.incarnation, write.page, write.gen, write.payload)
    return Step(state, (Envelope(decode_addr(state.index), landing),))


def _land(config, state: DecodeState, landing: Landing) -> Step:
    if landing.incarnation != state.incarnation:
        return Step(state)  # the memory registration died with the old process
    entry = state.ledger.entries[landing.page]
    rid = landing.request_id
    note = WriteLanded(state.index, landing.page, rid, landing.gen, entry.owner, entry.gen)
    ledger = state.ledger.land(landing.page, rid, landing.gen, landing.epoch,
                               landing.payload, digest_of(landing.payload))
    step = _try_commit(config, replace(state, ledger=ledger), rid)
    return Step(step.state, step.send, (note,) + step.notes)


def _transfer_done(config, state: DecodeState, message: TransferDone) -> Step:
    record = find(state.requests, message.manifest.request_id)
    step = decode_job.manifest_arrived(record.phase if record else None, bool(record and record.manifest))
    if not step.does(Effect.CHECK_KV):
        return Step(state)
    state = put(state, replace(record, manifest=message.manifest))
    return _try_commit(config, state, record.rid)


def _try_commit(config, state: DecodeState, rid: int) -> Step:
    record = find(state.requests, rid)
    if record is None or record.manifest is None:
        return Step(state)  # no manifest yet: nothing to check against
    step = decode_job.verdict(record.phase, lambda: _verdict(config, state, record))
    if step.does(Effect.MARK_FAILED):  # drains now: the pages wait for prefill's ack or the lease
        failed = (Envelope(ROUTER, TransferFailed(rid, step.detail)),)
        record = replace(record, phase=step.phase)
        if record.drain_acked:  # the ack came first (prefill's writes had ended): free now
            freed = _release(config, state, replace(record, phase=decode_job.drain_ack(record.phase).phase))
            return Step(freed.state, failed + freed.send, freed.notes)
        return Step(put(state, record), failed)
    if not step.does(Effect.COMMIT):
        return Step(state)  # moot, or waiting for more landings
    record = replace(record, phase=step.phase)
    note = Committed(state.index, rid, record.ticket.epoch, record.pages)
    return Step(put(state, record), notes=(note,))


def _verdict(config, state: DecodeState, record: DecodeRequest) -> str:
    """'' to commit, WAIT for more landings, else why the transfer failed."""
    ticket, manifest, guards = record.ticket, record.manifest, config.guards
    if config.variant is Variant.LEGACY:
        return "" if manifest.room == ticket.room else "room mismatch"
    if guards.coverage_check:
        # The runtime's own check (bulkhead.protocol.manifest) over the one
        # manifest type; the model's manifests carry no generations (each
        # write is checked against the generation instead), and count the
        # prompt in pages where the runtime counts tokens.
        allocated = Allocation(request_id=ticket.request_id, tenant=ticket.tenant, room=ticket.room,
                               epoch=ticket.epoch, token_count=ticket.admitted.prompt_pages,
                               pages=record.prompt_pages, generations=())
        if identity_problems(allocated, manifest) or len(manifest.digests) != len(manifest.pages):
            return "manifest does not match the allocation"
    entries = state.ledger.entries
    if guards.digest_check:
        landed = [entries[p].landed_digest if entries[p].written_epoch == ticket.epoch else None
                  for p in manifest.pages]
        if bad := mismatched_pages(manifest.pages, landed, manifest.digests):
            return f"digest mismatch on page {bad[0]}"
    if guards.coverage_check:
        if any(entries[p].written_epoch != ticket.epoch for p in record.prompt_pages):
            return WAIT  # writes may still be in flight; the deadline bounds the wait
    return ""


def _decode_step(config, state: DecodeState, event: DecodeStep) -> Step:
    record = find(state.requests, event.rid)
    if event.last:
        return _last_token(config, state, record)
    step = decode_job.decode_step(record.phase if record else None)
    if not step.does(Effect.DECODE_DONE):
        if record is not None and record.phase is Phase.DECODING:
            # A later step (the runtime decodes until the last token): it
            # reads every page of the request again, and changes nothing.
            return Step(state, notes=_reads(record, state.ledger))
        return Step(state)
    ticket, ledger = record.ticket, state.ledger
    for page in record.pages[ticket.admitted.prompt_pages:]:
        ledger = ledger.write_local(page, kv_origin(ticket.request_id, ticket.epoch))
    # The model's tokens are not modelled, and the router waits for the
    # last output only: this step sends nothing.
    return Step(put(replace(state, ledger=ledger), replace(record, phase=step.phase)), notes=_reads(record, ledger))


def _reads(record: DecodeRequest, ledger: Ledger) -> tuple[PageRead, ...]:
    """Attention reads every page of the request."""
    t = record.ticket
    return tuple(PageRead(t.request_id, t.tenant, t.epoch, p, ledger.entries[p].content) for p in record.pages)


def _last_token(config, state: DecodeState, record: DecodeRequest) -> Step:
    """The success path's end: the pages are scrubbed and freed and the
    router hears the finished output (no error: the 200). No Finalize
    follows, and prefill's ack, before or after, changes nothing more."""
    step = decode_job.finished(record.phase)
    done = Output(RequestOutput(record.rid, (), "", (), True, "length", 0, 0))
    freed = _release(config, state, replace(record, phase=step.phase))
    return Step(freed.state, (Envelope(ROUTER, done),) + freed.send, freed.notes)


def _finalize(config, state: DecodeState, message: Finalize) -> Step:
    rid = message.request_id
    record = find(state.requests, rid) or DecodeRequest(rid, phase=None)  # none yet
    step = decode_job.finalize(record.phase, record.drain_acked, drain_guard=config.guards.drain_before_reuse)
    if step.outcome == "repeat":
        return Step(state)
    # The table sends a record holding pages to DRAINING, one without to DONE;
    # a committed one stays (ABORT_ENGINE): the engine ends it at its next
    # step, which frees the pages (the scheduler's last token).
    record = replace(record, phase=step.phase, outcome=message.outcome)
    if step.does(Effect.RELEASE_PAGES):
        return _release(config, state, record)
    return Step(put(state, record))


def _drain_ack(config, state: DecodeState, message: DrainAck) -> Step:
    record = find(state.requests, message.request_id)
    step = decode_job.drain_ack(record.phase if record else None)
    if step.does(Effect.RELEASE_PAGES):
        return _release(config, state, replace(record, phase=step.phase))
    if not step.does(Effect.MARK_DRAINED):
        return Step(state)  # late: the request is done
    return Step(put(state, replace(record, drain_acked=True)))


def _lease_expired(config, state: DecodeState, event: LeaseExpired) -> Step:
    record = find(state.requests, event.rid)
    step = decode_job.lease_expired(record.phase if record else None)
    if not step.does(Effect.RELEASE_PAGES):
        return Step(state)
    return _release(config, state, replace(record, phase=step.phase))


def _release(config, state: DecodeState, record: DecodeRequest) -> Step:
    """Free the pages of a record the table has just moved to DONE."""
    ledger = state.ledger.release(record.pages, scrub=config.guards.scrub_on_free)
    # Keep only what an audit needs, so equal outcomes make equal states.
    record = DecodeRequest(record.rid, record.phase, ticket=record.ticket, outcome=record.outcome)
    state = put(replace(state, ledger=ledger), record)
    return _allocate_waiting(config, state)


_HANDLERS = {
    Assign: _assign, PageWrite: _admit_write, Landing: _land, TransferDone: _transfer_done,
    DecodeStep: _decode_step, Finalize: _finalize, DrainAck: _drain_ack,
    LeaseExpired: _lease_expired, Reserved: _reserved,
}
