"""The world state and the environment: every action an adversarial but
bounded environment may take (docs/verification.md, "What is modelled"),
each applied through the protocol's own transition functions. Control
messages are retransmitted until acked, so a control drop is a delay, which
reordering already covers; page allocation is LIFO, as the incident's was.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from bulkhead.protocol.messages import Assign, DrainAck
from bulkhead.protocol.ticket import SignedTicket, Ticket
from bulkhead.protocol.types import Outcome, Phase
from bulkhead.verify.actors.config import ProtocolConfig
from bulkhead.verify.actors.decode import DecodeState, decode_initial, decode_restart, decode_step
from bulkhead.verify.actors.events import (
    ClientAbort, DeadlinePassed, DecodeStep, DrainWorker, HandedOver, LeaseExpired, PeerLost, PromptFailed,
    Quiesced, Reserved, Submit, WriteFailed,
)
from bulkhead.verify.actors.network import Envelope, Landing, PageWrite
from bulkhead.verify.actors.prefill import PrefillState, prefill_restart, prefill_step
from bulkhead.verify.actors.router import RouterState, router_step
from bulkhead.verify.actors.values import GARBAGE, ROUTER, cached_hash, decode_addr, prefill_addr
from bulkhead.verify.world import World

Network = frozenset  # of (Envelope, copies)


@cached_hash
@dataclass(frozen=True)
class WorldState:
    router: RouterState
    prefills: tuple[PrefillState, ...]
    decodes: tuple[DecodeState, ...]
    network: Network
    faults_left: int
    drains_left: int = 0


@dataclass(frozen=True)
class Transition:
    label: str             # what the environment did, for traces
    state: WorldState
    notes: tuple = ()      # observations from the step functions
    sent: tuple = ()


def initial_state(world: World, config: ProtocolConfig) -> WorldState:
    return WorldState(RouterState(), tuple(PrefillState(i) for i in range(len(world.prefill_pools))),
                      tuple(decode_initial(config, i) for i in range(len(world.decode_pools))),
                      frozenset(), world.faults, world.drains)


def in_flight(state: WorldState):
    return [message for message, _ in state.network]


def _add(network: Network, messages) -> Network:
    counts = dict(network)
    for message in messages:
        counts[message] = counts.get(message, 0) + 1
    return frozenset(counts.items())


def _remove(network: Network, message) -> Network:
    counts = dict(network)
    counts[message] -= 1
    if not counts[message]:
        del counts[message]
    return frozenset(counts.items())


def apply_event(config: ProtocolConfig, state: WorldState, dst, event, label: str,
                network: Network | None = None) -> Transition:
    """Run the destination actor's step function and put its sends in flight."""
    _, step = _actor_step(config, state, dst, event)
    state = _with_actor(state, dst, step.state)
    sent = tuple(_relayed(state.router, envelope) for envelope in step.send)
    base = state.network if network is None else network
    state = replace(state, network=_add(base, sent))
    return Transition(label, _collect_garbage(config, state), step.notes, sent)


def _relayed(router: RouterState, envelope: Envelope) -> Envelope:
    """A drain ack goes to the router, which relays it to the decode worker
    of the request's pair (the runtime's _relay_drain_ack, which relays it
    after the route is gone too): the model's network does both in one step,
    as the router's record of the pair says."""
    if envelope.dst != ROUTER or not isinstance(envelope.body, DrainAck):
        return envelope
    record = next(r for r in router.requests if r.rid == envelope.body.request_id)
    return replace(envelope, dst=decode_addr(record.spec.decode))


def _collect_garbage(config: ProtocolConfig, state: WorldState) -> WorldState:
    """Drop control messages addressed to an actor whose record of that
    request is DONE: every step function ignores those, now and forever,
    so delivering them at every point would only multiply states. Each one
    is delivered once as it is dropped, and must change nothing (else the
    search stops: the reduction would be unsound); that delivery is also
    how the search takes the transition functions' no-op outcomes (a
    repeated finalize, a late report). Data-plane writes are never
    dropped: what they do depends on the ledger, not on the record."""
    done = {addr: {r.rid for r in _actor(state, addr).requests if r.phase is Phase.DONE}
            for addr in [ROUTER, *_workers(state)]}
    kept = frozenset((m, n) for m, n in state.network
                     if isinstance(m.body, (PageWrite, Landing)) or m.body.request_id not in done[m.dst])
    if len(kept) == len(state.network):
        return state
    for message, _ in state.network - kept:
        _check_no_op(config, state, message)
    return replace(state, network=kept)


_STEP_FUNCTIONS = {"router": router_step, "prefill": prefill_step, "decode": decode_step}


def _actor_step(config: ProtocolConfig, state: WorldState, dst, event):
    """The destination actor's state, and its step on event."""
    actor = _actor(state, dst)
    return actor, _STEP_FUNCTIONS[dst[0]](config, actor, event)


def _with_actor(state: WorldState, dst, actor) -> WorldState:
    kind, index = dst
    if kind == "router":
        return replace(state, router=actor)
    if kind == "prefill":
        return replace(state, prefills=_set(state.prefills, index, actor))
    return replace(state, decodes=_set(state.decodes, index, actor))


def _check_no_op(config: ProtocolConfig, state: WorldState, message) -> None:
    before, step = _actor_step(config, state, message.dst, message)
    if step.state != before or step.send or step.notes:
        raise AssertionError(f"unsound reduction: {_show(message)} to a DONE record changed its actor")


def _set(items: tuple, index: int, item) -> tuple:
    return items[:index] + (item,) + items[index + 1:]


def successors(world: World, config: ProtocolConfig, state: WorldState) -> list[Transition]:
    known = {r.rid for r in state.router.requests}
    out = [apply_event(config, state, ROUTER, Submit(spec), f"client submits r{spec.rid}")
           for spec in world.requests if spec.rid not in known]
    out += [apply_event(config, state, m.dst, m, f"deliver {_show(m)}", _remove(state.network, m))
            for m in in_flight(state)]
    return (out + _timers_and_scheduler(config, state, _moving(state)) + _faults(world, config, state)
            + _drains(config, state))


def _workers(state: WorldState) -> list[tuple[str, int]]:
    return [prefill_addr(p.index) for p in state.prefills] + [decode_addr(d.index) for d in state.decodes]


def _drains(config: ProtocolConfig, state: WorldState) -> list[Transition]:
    """The operator drains any worker (again, too: a repeat changes nothing)."""
    if not state.drains_left:
        return []
    spent = replace(state, drains_left=state.drains_left - 1)
    return [apply_event(config, spent, ROUTER, DrainWorker(w), f"operator drains {w[0]}{w[1]}")
            for w in _workers(state)]


def _moving(state: WorldState) -> set:
    """Requests that some message, scheduler step or drain can still move."""
    moving = {m.body.request_id for m in in_flight(state)}
    # Each can take a step of its own: decode, finish, ack or expire; and an
    # engine's step in flight: prefill's hand-over, decode's reservation.
    stepping = (Phase.COMMITTED, Phase.DECODING, Phase.TRANSFERRING, Phase.DRAINING)
    for prefill in state.prefills:
        moving |= {r.rid for r in prefill.requests if r.phase in stepping or r.computing}
    for decode in state.decodes:
        moving |= {r.rid for r in decode.requests if r.phase in stepping or r.reserving}
    return moving


def _timers_and_scheduler(config: ProtocolConfig, state: WorldState, moving: set) -> list[Transition]:
    """The runtime's own steps: timers firing, engines stepping, restarts noticed."""
    return (_router_deadlines(config, state, moving) + _prefill_engine_steps(config, state, _writes(state))
            + _decode_engine_steps(config, state, dmas_in_flight(state)) + _restarts_noticed(config, state))


def _writes(state: WorldState) -> set:
    """Requests with a page write or landing still in flight."""
    return {m.body.request_id for m in in_flight(state) if isinstance(m.body, (PageWrite, Landing))}


def _router_deadlines(config: ProtocolConfig, state: WorldState, moving: set) -> list[Transition]:
    # A deadline and a client abort take the same path (the router
    # finalizes), so the abort, allowed at any point, covers the race;
    # the deadline fires only where nothing else can move the request.
    return [apply_event(config, state, ROUTER, DeadlinePassed(r.rid), f"deadline of r{r.rid} passes")
            for r in state.router.requests if r.phase is not Phase.DONE and r.rid not in moving]


def _prefill_engine_steps(config: ProtocolConfig, state: WorldState, writes: set) -> list[Transition]:
    out = []
    for prefill in state.prefills:
        def step(event, label: str) -> None:
            out.append(apply_event(config, state, prefill_addr(prefill.index), event, f"prefill{prefill.index}{label}"))

        for record in prefill.requests:
            rid = record.rid
            if record.computing:  # the engine's step ends: the KV is handed over, outcome or not
                step(HandedOver(rid), f"'s engine hands r{rid}'s KV over")
            # After the outcome (once the engine has let go of the prompt), or
            # (the success path) as soon as the writes it posted have ended.
            if record.phase in (Phase.DRAINING, Phase.TRANSFERRING) and rid not in writes and not record.computing:
                step(Quiesced(rid), f" sees r{rid}'s writes complete")
            # A self-loop, as the runtime takes it: another thread (the
            # engine's output, a transfer's end) asks to ack a request that
            # is over (a failed write left it DONE, never acked); nothing.
            if record.phase is Phase.DONE and record.ticket is not None:
                step(Quiesced(rid), f" sees finished r{rid}'s writes end late")
    return out


def _decode_engine_steps(config: ProtocolConfig, state: WorldState, dmas: set) -> list[Transition]:
    """dmas: requests with an admitted DMA still landing (dmas_in_flight)."""
    out = []
    for decode in state.decodes:
        def step(event, label: str) -> None:
            out.append(apply_event(config, state, decode_addr(decode.index), event, f"decode{decode.index}{label}"))

        for record in decode.requests:
            rid = record.rid
            if record.reserving:  # the engine's reservation reaches the job (the outcome may have come first)
                step(Reserved(rid), f"'s engine reserves r{rid}'s pages")
            if record.phase in (Phase.COMMITTED, Phase.DECODING) and record.outcome is not None:
                # Finalized while committed (an abort): the engine ends the
                # request at its next step, freeing the pages, under the
                # same fence as the last token below.
                if rid not in dmas:
                    step(DecodeStep(rid, last=True), f"'s engine ends aborted r{rid}")
                continue
            if record.phase is Phase.COMMITTED:
                step(DecodeStep(rid), f" runs r{rid}'s decode step")
            # Runtime steps that change no state, each a self-loop here: a
            # later decode step (which reads every page again, so every read
            # is checked, not only the first), and a lease timer that fires
            # after the ack freed the pages.
            if record.phase is Phase.DECODING:
                step(DecodeStep(rid), f" runs r{rid}'s next decode step")
                # The last token frees the pages. The runtime commits on
                # TransferDone, which prefill sends once every write it
                # posted has returned, so no write of the request is in
                # flight after its commit; the model's network can still
                # hold a duplicated DMA (the "duplicate" fault), and the
                # request ends only once it has landed: the fence the lease
                # assumes too.
                if rid not in dmas:
                    step(DecodeStep(rid, last=True), f" emits r{rid}'s last token")
            if record.phase is Phase.DONE:
                step(LeaseExpired(rid), f"'s lease timer for finished r{rid} fires late")
            # The lease fence: in-flight DMA never outlives the lease.
            if record.phase is Phase.DRAINING and rid not in dmas:
                step(LeaseExpired(rid), f"'s drain lease for r{rid} expires")
    return out


def _restarts_noticed(config: ProtocolConfig, state: WorldState) -> list[Transition]:
    known = dict(state.router.known_incarnations)
    restarted = [(w, _actor(state, w).incarnation) for w in _workers(state)]
    return [apply_event(config, state, ROUTER, PeerLost(w, inc), f"router notices {w[0]}{w[1]} restarted")
            for w, inc in restarted if inc > known.get(w, 1)]


def dmas_in_flight(state: WorldState) -> set:
    """Requests with an admitted DMA still landing. Neither the lease nor
    the last token frees pages under one: the fence the model assumes
    (no admitted write outlives write_within_s, and none is in flight after
    a commit, which follows TransferDone: prefill sends it once every write
    it posted has returned)."""
    return {m.body.request_id for m in in_flight(state) if isinstance(m.body, Landing)}


def _actor(state: WorldState, addr):
    if addr[0] == "router":
        return state.router
    return (state.prefills if addr[0] == "prefill" else state.decodes)[addr[1]]


def _faults(world: World, config: ProtocolConfig, state: WorldState) -> list[Transition]:
    """One shared budget: a crash, an abort, a lost, duplicated or corrupted
    write, a forged message, a failed write, a failed prompt. Each costs one."""
    if not state.faults_left:
        return []
    kinds, network = world.fault_kinds, state.network
    spent = replace(state, faults_left=state.faults_left - 1)
    out = [apply_event(config, spent, ROUTER, ClientAbort(r.rid), f"client aborts r{r.rid}")
           for r in state.router.requests if "abort" in kinds and r.phase is not Phase.DONE]
    writing = _writes(state)
    for prefill in state.prefills:
        addr, name = prefill_addr(prefill.index), f"prefill{prefill.index}"
        for r in prefill.requests:
            if "fail_write" in kinds and r.rid in writing and r.phase in (Phase.TRANSFERRING, Phase.DRAINING):
                out.append(apply_event(config, spent, addr, WriteFailed(r.rid),
                                       f"{name}'s transfer of r{r.rid} fails, a write in flight"))
            if "fail_prompt" in kinds and r.computing and r.phase is Phase.WAITING_POOL:
                out.append(apply_event(config, spent, addr, PromptFailed(r.rid),
                                       f"{name}'s engine fails r{r.rid}'s prompt"))
        if "crash" in kinds and _busy(prefill):
            crashed = replace(spent, prefills=_set(state.prefills, prefill.index, prefill_restart(prefill)))
            out.append(Transition(f"{name} crashes and restarts", crashed))
    for decode in state.decodes:
        if "crash" in kinds and _busy(decode):
            # DMA into the dead process's registered memory is cancelled with it.
            kept = frozenset((m, n) for m, n in network
                             if not (isinstance(m.body, Landing) and m.dst == decode_addr(decode.index)))
            restarted = _set(state.decodes, decode.index, decode_restart(config, decode))
            crashed = replace(spent, network=kept, decodes=restarted)
            out.append(Transition(f"decode{decode.index} crashes and restarts", crashed))
    for m in in_flight(state):
        if "duplicate" in kinds:
            out.append(Transition(f"network duplicates {_show(m)}", replace(spent, network=_add(network, [m]))))
        if "lose" in kinds and isinstance(m.body, (PageWrite, Landing)):
            out.append(Transition(f"network loses {_show(m)}", replace(spent, network=_remove(network, m))))
        if "corrupt" in kinds and isinstance(m.body, PageWrite) and m.body.payload != GARBAGE:
            corrupt = replace(m, body=replace(m.body, payload=GARBAGE))
            out.append(Transition(f"network corrupts {_show(m)}",
                                  replace(spent, network=_add(_remove(network, m), [corrupt]))))
    out += [Transition(label, replace(spent, network=_add(network, [forged])))
            for forged, label in (_forgeries(state) if "forge" in kinds else ())]
    return out


def _busy(actor) -> bool:
    """A crash of an idle worker only renumbers it; skip those."""
    return any(r.phase is not Phase.DONE for r in actor.requests)


def _forgeries(state: WorldState):
    """Unsigned control messages an attacker on the control network could
    inject: a drain ack for a request whose writes may be in flight, and a
    ticket for a request the router rejected."""
    for decode in state.decodes:
        for record in decode.requests:
            if record.pages and record.phase is not Phase.DONE:
                yield (Envelope(decode_addr(decode.index), DrainAck(record.rid), signed=False),
                       f"attacker forges DrainAck(r{record.rid}) to decode{decode.index}")
    for record in state.router.requests:
        if record.outcome is Outcome.REJECTED:
            spec = record.spec
            ticket = SignedTicket(Ticket(spec, room=0, epoch=1), mac="")  # without the key: no valid MAC
            yield (Envelope(decode_addr(spec.decode), Assign(spec.rid, ticket), signed=False),
                   f"attacker forges a ticket for rejected r{spec.rid} to decode{spec.decode}")


def _show(envelope: Envelope) -> str:
    message = envelope.body
    name = type(message).__name__
    dst = f"{envelope.dst[0]}{envelope.dst[1]}" if envelope.dst[0] != "router" else "router"
    rid = message.request_id
    extra = ""
    if isinstance(message, (PageWrite, Landing)):
        extra = f" page {message.page} gen {message.gen}" + (" GARBAGE" if message.payload == GARBAGE else "")
    if hasattr(message, "outcome"):
        extra = f" {message.outcome.name}"
    if hasattr(message, "generations"):
        extra = " pages " + ",".join(str(p) for p in message.pages)
    if hasattr(message, "manifest"):
        extra = f" pages {list(message.manifest.pages)} count {message.manifest.token_count}"
    forged = "" if envelope.signed else " (unsigned)"
    return f"{name}(r{rid}{extra}) to {dst}{forged}"
