"""The router's half of the protocol: one admission decision, bootstrap
(room and pair), and the one terminal outcome of every request.

The router is the only actor that decides an outcome. Workers report
(Output, TransferFailed) and record what the router decided (Finalize),
so router, prefill and decode always agree. Its decisions are router_job.py's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from bulkhead.protocol import router_job
from bulkhead.protocol.messages import Assign, Finalize, Output, PrefillFailed, TransferFailed
from bulkhead.protocol.ticket import SignedTicket, Ticket
from bulkhead.protocol.transitions import Effect
from bulkhead.protocol.types import Outcome, Phase
from bulkhead.verify.actors.config import ProtocolConfig, RequestSpec, Variant
from bulkhead.verify.actors.events import (
    ClientAbort, ClientResponse, DeadlinePassed, DrainWorker, PeerLost, Step, Submit,
)
from bulkhead.verify.actors.network import Envelope
from bulkhead.verify.actors.values import MODEL_MAC, cached_hash, decode_addr, find, prefill_addr, put

FIRST_EPOCH = 1  # retries would bump it; this version does not retry


@cached_hash
@dataclass(frozen=True)
class RouterRequest:
    spec: RequestSpec
    phase: Phase                 # ADMITTED, BOOTSTRAPPED or DONE
    room: int | None = None      # kept after DONE, for audit
    epoch: int = FIRST_EPOCH
    outcome: Outcome | None = None
    detail: str = ""             # why, for the client's error body

    @property
    def rid(self) -> int:
        return self.spec.rid


@cached_hash
@dataclass(frozen=True)
class RouterState:
    requests: tuple[RouterRequest, ...] = ()
    # worker address -> last incarnation the router heard of
    known_incarnations: tuple[tuple[tuple, int], ...] = ()
    draining: tuple[tuple, ...] = ()  # worker addresses assigned nothing more (sorted)

    def rooms_in_use(self) -> tuple[int, ...]:
        return tuple(r.room for r in self.requests if r.phase is Phase.BOOTSTRAPPED)


def router_step(config: ProtocolConfig, state: RouterState, event) -> Step:
    if isinstance(event, Envelope):
        if not event.signed and config.guards.hmac:
            return Step(state)  # forged or tampered: the HMAC does not verify
        event = event.body
    if isinstance(event, Submit):
        return _submit(config, state, event.spec)
    if isinstance(event, ClientAbort):
        return _finalize(config, state, event.rid, Outcome.ABORTED, "client aborted")
    if isinstance(event, DeadlinePassed):
        return _finalize(config, state, event.rid, Outcome.TIMED_OUT, "deadline passed")
    if isinstance(event, Output):  # the model's decode sends one output, its last (the 200)
        return _finished(config, state, event.request_id)
    if isinstance(event, TransferFailed):
        return _finalize(config, state, event.request_id, Outcome.TRANSFER_FAILED, event.reason)
    if isinstance(event, PrefillFailed):
        # LEGACY: prefill's 400 is dropped; the router waits for decode's 200.
        # REAL prefill never re-decides admission; it sends this when its
        # engine fails the prompt (the "fail_prompt" fault).
        legacy = config.variant is Variant.LEGACY
        return Step(state) if legacy else _finalize(config, state, event.request_id, Outcome.PREFILL_FAILED,
                                                    event.reason)
    if isinstance(event, PeerLost):
        return _peer_lost(config, state, event)
    if isinstance(event, DrainWorker):
        if router_job.drain_worker(event.worker in state.draining).outcome == "repeat":
            return Step(state)
        return Step(replace(state, draining=tuple(sorted(state.draining + (event.worker,)))))
    raise TypeError(f"router cannot handle {type(event).__name__}")


def _submit(config: ProtocolConfig, state: RouterState, spec: RequestSpec) -> Step:
    if find(state.requests, spec.rid) is not None:
        return Step(state)  # a client retry of a known id is not a new request
    admit_first = config.variant is Variant.REAL and config.guards.admission_before_bootstrap
    step = router_job.submit(_rejection(config, spec) if admit_first else "")
    if step.outcome == "rejected":
        record = RouterRequest(spec, step.phase, outcome=Outcome.REJECTED, detail=step.detail)
        return Step(put(state, record),
                    notes=(ClientResponse(spec.rid, Outcome.REJECTED, step.detail),))
    record = RouterRequest(spec, step.phase)
    state = put(state, record)
    return _bootstrap_waiting(config, state)


def _rejection(config: ProtocolConfig, spec: RequestSpec) -> str:
    """'' if the request fits the smallest limit of its pair, else the typed
    reason the client needs: which limit, its value, what was asked."""
    name, limit = config.admission_limit(spec)
    if spec.total_pages <= limit:
        return ""
    return f"{name} limit {limit} pages < {spec.total_pages} pages asked"


def _bootstrap_waiting(config: ProtocolConfig, state: RouterState) -> Step:
    """Give rooms to admitted requests, in rid order, while rooms are free."""
    sends, notes = [], []
    for record in state.requests:
        if record.phase is not Phase.ADMITTED:
            continue
        free = [room for room in range(config.rooms) if room not in state.rooms_in_use()]
        if not free:
            break
        spec = record.spec
        pair_draining = bool({prefill_addr(spec.prefill), decode_addr(spec.decode)} & set(state.draining))
        step = router_job.bootstrap(record.phase, pair_draining)
        if not step.does(Effect.ASSIGN_BOTH):
            continue  # held: it waits (its deadline ends it) rather than go to a draining worker
        record = replace(record, phase=step.phase, room=free[0])
        state = put(state, record)
        known = dict(state.known_incarnations)
        ticket = SignedTicket(Ticket(spec, record.room, record.epoch,
                                     prefill_incarnation=known.get(prefill_addr(spec.prefill), 1),
                                     decode_incarnation=known.get(decode_addr(spec.decode), 1)), MODEL_MAC)
        assign = Assign(spec.rid, ticket)
        sends += [Envelope(prefill_addr(spec.prefill), assign), Envelope(decode_addr(spec.decode), assign)]
        late_check = config.variant is Variant.REAL and not config.guards.admission_before_bootstrap
        if late_check and _rejection(config, spec):
            # Guard off: the decision comes after the room and the tickets.
            step = _finalize(config, state, spec.rid, Outcome.REJECTED, _rejection(config, spec),
                             bootstrap_after=False)
            state = step.state
            sends += step.send
            notes += step.notes
    return Step(state, tuple(sends), tuple(notes))


def _finalize(config: ProtocolConfig, state: RouterState, rid: int, outcome: Outcome,
              detail: str = "", bootstrap_after: bool = True) -> Step:
    record = find(state.requests, rid)
    step = router_job.decide(record.phase if record else None)
    if step.outcome == "repeat":
        return Step(state)  # first decision wins; duplicates and late reports are no-ops
    sends = ()
    if step.does(Effect.FINALIZE_WORKERS):
        spec = record.spec
        finalize = Finalize(rid, outcome)
        sends = (Envelope(prefill_addr(spec.prefill), finalize), Envelope(decode_addr(spec.decode), finalize))
    record = replace(record, phase=step.phase, outcome=outcome, detail=detail)
    state = put(state, record)
    notes = (ClientResponse(rid, outcome, detail),)
    if not bootstrap_after:
        return Step(state, sends, notes)
    more = _bootstrap_waiting(config, state)  # the room just came free
    return Step(more.state, sends + more.send, notes + more.notes)


def _finished(config: ProtocolConfig, state: RouterState, rid: int) -> Step:
    """Decode's last output answers the client. The workers are not told:
    each ends a success on its own (decode freed its pages with the last
    token, prefill acks as its writes end)."""
    record = find(state.requests, rid)
    step = router_job.finished(record.phase if record else None)
    if step.outcome == "repeat":
        return Step(state)  # an abort or deadline answered first
    record = replace(record, phase=step.phase, outcome=Outcome.FINISHED)
    state = put(state, record)
    more = _bootstrap_waiting(config, state)  # the room just came free
    return Step(more.state, more.send, (ClientResponse(rid, Outcome.FINISHED, ""),) + more.notes)


def _peer_lost(config: ProtocolConfig, state: RouterState, event: PeerLost) -> Step:
    known = dict(state.known_incarnations)
    if event.incarnation <= known.get(event.worker, 1):
        return Step(state)
    known[event.worker] = event.incarnation
    state = replace(state, known_incarnations=tuple(sorted(known.items())))
    sends, notes = (), ()
    for record in state.requests:
        spec = record.spec
        on_worker = event.worker in (prefill_addr(spec.prefill), decode_addr(spec.decode))
        if record.phase is Phase.BOOTSTRAPPED and on_worker:
            step = _finalize(config, state, record.rid, Outcome.PEER_LOST, f"{event.worker} restarted")
            state, sends, notes = step.state, sends + step.send, notes + step.notes
    return Step(state, sends, notes)
