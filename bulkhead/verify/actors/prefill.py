"""The prefill worker's half of the protocol: compute a ticket's prompt into
local pages, write them into the pages decode granted, say what was sent,
and after the router's outcome acknowledge the drain.

Prefill never decides admission (REAL): the ticket says the request fits.
LEGACY keeps the incident's behaviour: a prompt over prefill's own limit
gets a pending rejection and continues as a live 1-token stub. Its
decisions are prefill_job.py's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from bulkhead.protocol import prefill_job
from bulkhead.protocol.manifest import Manifest
from bulkhead.protocol.messages import (
    Assign, DrainAck, Finalize, PagesGranted, PrefillFailed, TransferDone, TransferFailed,
)
from bulkhead.protocol.ticket import Ticket
from bulkhead.protocol.transitions import Effect
from bulkhead.protocol.types import Outcome, Phase
from bulkhead.verify.actors.config import ProtocolConfig, Variant
from bulkhead.verify.actors.events import HandedOver, PromptFailed, Quiesced, Step, WriteFailed
from bulkhead.verify.actors.network import Envelope, PageWrite, dispatch
from bulkhead.verify.actors.values import (
    MODEL_MAC, ROUTER, cached_hash, decode_addr, digest_of, find, kv_origin, put,
)


@cached_hash
@dataclass(frozen=True)
class PrefillRequest:
    rid: int
    phase: Phase | None                   # WAITING_POOL .. TRANSFERRING, DRAINING, DONE (lifecycle.py);
                                          # None only inside a step, until the table gives one
    ticket: Ticket | None = None          # verified: the signature is off
    grant: PagesGranted | None = None     # may arrive before the ticket
    local_pages: int = 0                  # pages held in prefill's own pool
    computing: bool = False               # the engine has the prompt: no hand-over yet
    outcome: Outcome | None = None
    stub: bool = False                    # LEGACY: prompt swapped for 1 token


@cached_hash
@dataclass(frozen=True)
class PrefillState:
    index: int
    incarnation: int = 1
    requests: tuple[PrefillRequest, ...] = ()

    def pages_in_use(self) -> int:
        return sum(r.local_pages for r in self.requests)


def prefill_restart(state: PrefillState) -> PrefillState:
    """A crash and restart: all volatile state is gone."""
    return PrefillState(state.index, state.incarnation + 1)


def prefill_step(config: ProtocolConfig, state: PrefillState, event) -> Step:
    return dispatch(config, state, event, _HANDLERS, "prefill")


def _assign(config: ProtocolConfig, state: PrefillState, message: Assign) -> Step:
    ticket = message.ticket.ticket
    if (message.ticket.mac != MODEL_MAC and config.guards.hmac) or ticket.prefill_incarnation != state.incarnation:
        return Step(state)
    known = find(state.requests, ticket.request_id)
    step = prefill_job.assign(known.phase if known else None, bool(known and known.ticket))
    if step.outcome == "duplicate":
        return Step(state)  # duplicate, or the outcome is already known
    record = replace(known or PrefillRequest(ticket.request_id, step.phase), ticket=ticket)
    sends = ()
    if config.variant is Variant.LEGACY and ticket.admitted.prompt_pages > _legacy_input_limit(config, state):
        # The incident: the rejection is a flag on a live request, the prompt
        # becomes a 1-token stub, and the 400 goes to a router that drops it.
        record = replace(record, stub=True, outcome=Outcome.REJECTED)
        sends = (Envelope(ROUTER, PrefillFailed(ticket.request_id, "prompt over prefill's own limit",
                                                "context_length_exceeded")),)
    step = _advance(config, put(state, record))
    return Step(step.state, sends + step.send)


def _legacy_input_limit(config: ProtocolConfig, state: PrefillState) -> int:
    # max_req_input_len = min(context_len - 1, pool_tokens - 1), in pages
    return min(config.context_pages, config.prefill_pools[state.index]) - 1


def _granted(config: ProtocolConfig, state: PrefillState, grant: PagesGranted) -> Step:
    known = find(state.requests, grant.request_id)
    step = prefill_job.pages_granted(known.phase if known else None, bool(known and known.grant))
    if step.outcome == "late":
        return Step(state)  # duplicate, or too late: never write after the outcome
    return _advance(config, put(state, replace(known or PrefillRequest(grant.request_id, step.phase), grant=grant)))


def _advance(config: ProtocolConfig, state: PrefillState) -> Step:
    """Give local pages to waiting tickets (their engine computes the
    prompt: a step of its own, HandedOver), then post the writes of every
    prefilled request whose grant has arrived."""
    sends = []
    for record in state.requests:
        if record.phase is Phase.WAITING_POOL and record.ticket is not None and not record.computing:
            need = 1 if record.stub else record.ticket.admitted.prompt_pages
            if config.prefill_pools[state.index] - state.pages_in_use() >= need:
                state = put(state, record := replace(record, local_pages=need, computing=True))
        step = prefill_job.start_transfer(record.phase, _grant_matches(record))
        if step.does(Effect.POST_WRITES):
            record, posted = _post_writes(replace(record, phase=step.phase))
            state = put(state, record)
            sends += posted
    return Step(state, tuple(sends))


def _grant_matches(record: PrefillRequest) -> bool:
    grant, ticket = record.grant, record.ticket
    return (grant is not None and ticket is not None
            and (grant.room, grant.epoch, grant.transfer.descriptor[0])
            == (ticket.room, ticket.epoch, ticket.admitted.decode))


def _post_writes(record: PrefillRequest) -> tuple[PrefillRequest, list]:
    ticket, grant = record.ticket, record.grant
    rid = ticket.request_id
    payload = kv_origin(rid, ticket.epoch)
    # LEGACY's stub has 1 token of KV: it writes one page and, judging by its
    # own count, calls the transfer complete.
    grants = tuple(zip(grant.pages, grant.generations))
    grants = grants[:1] if record.stub else grants
    dst = decode_addr(ticket.admitted.decode)
    _, incarnation = grant.transfer.descriptor  # the model's endpoint: (decode index, incarnation)
    sends = [Envelope(dst, PageWrite(rid, ticket.room, ticket.epoch, incarnation, page, gen, payload))
             for page, gen in grants]
    # The runtime's manifest; the model counts the prompt in pages where the
    # runtime counts tokens, and checks generations per write, not here.
    manifest = Manifest(rid, ticket.tenant, ticket.room, ticket.epoch, prefix_len=0,
                        token_count=1 if record.stub else ticket.admitted.prompt_pages,
                        pages=tuple(page for page, _ in grants), generations=(),
                        digests=tuple(digest_of(payload) for _ in grants))
    # No first token or sampler state: the model decodes no real tokens.
    sends.append(Envelope(dst, TransferDone(rid, manifest, first_token=0, first_logprobs=(), sampler_state=None)))
    return record, sends


def _finalize(config: ProtocolConfig, state: PrefillState, message: Finalize) -> Step:
    rid = message.request_id
    record = find(state.requests, rid) or PrefillRequest(rid, phase=None)  # none yet
    step = prefill_job.finalize(record.phase)  # STOP_ENGINE: the model's prefill has no computation to stop
    if step.outcome == "repeat":
        return Step(state)
    # A LEGACY stub keeps its own 400: that disagreement is the bug.
    outcome = record.outcome or message.outcome
    record = replace(record, phase=step.phase, outcome=outcome)
    return Step(put(state, record))


def _quiesced(config: ProtocolConfig, state: PrefillState, event: Quiesced) -> Step:
    """No write for rid is outstanding: release local pages, tell decode."""
    record = find(state.requests, event.rid)
    step = prefill_job.quiesced(record.phase if record else None)
    if not step.does(Effect.SEND_DRAIN_ACK):
        return Step(state)
    # To the router, which relays it to the pair's decode worker (the
    # model's network does so in the same step: verify/model.py _relayed).
    ack = Envelope(ROUTER, DrainAck(event.rid))
    step = _advance(config, put(state, replace(record, phase=step.phase, local_pages=0, grant=None)))
    return Step(step.state, (ack,) + step.send)  # local pages came free


def _handed_over(config: ProtocolConfig, state: PrefillState, event: HandedOver) -> Step:
    """The engine hands the prompt's KV over: ready to write once a grant
    is here; after the outcome the pages go straight back (nothing was
    posted) and, no write being outstanding, the drain is acked."""
    record = find(state.requests, event.rid)
    step = prefill_job.prefilled(record.phase)
    record = replace(record, phase=step.phase, computing=False)
    if step.does(Effect.RELEASE_LOCAL):
        return _quiesced(config, put(state, replace(record, local_pages=0)), Quiesced(event.rid))
    return _advance(config, put(state, record))


def _prompt_failed(config: ProtocolConfig, state: PrefillState, event: PromptFailed) -> Step:
    """The engine ends the prompt with an error before the hand-over: the
    router hears it (a typed error for the client), and nothing having been
    written, prefill's pages go and decode may free its own at once."""
    state = put(state, replace(find(state.requests, event.rid), computing=False))
    failed = Envelope(ROUTER, PrefillFailed(event.rid, "the prompt's computation failed", "internal_error"))
    step = _quiesced(config, state, Quiesced(event.rid))
    return Step(step.state, (failed,) + step.send, step.notes)


def _write_failed(config: ProtocolConfig, state: PrefillState, event: WriteFailed) -> Step:
    """The transfer failed with a write in flight: tell the router, free the
    local pages, and never ack (the runtime's _undrained)."""
    record = find(state.requests, event.rid)
    step = prefill_job.undrained(record.phase)
    failed = Envelope(ROUTER, TransferFailed(event.rid, "transfer failed with a write in flight"))
    more = _advance(config, put(state, replace(record, phase=step.phase, local_pages=0, grant=None)))
    return Step(more.state, (failed,) + more.send)  # local pages came free


_HANDLERS = {Assign: _assign, PagesGranted: _granted, Finalize: _finalize, Quiesced: _quiesced,
             HandedOver: _handed_over, PromptFailed: _prompt_failed, WriteFailed: _write_failed}
