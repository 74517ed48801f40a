"""The safety properties, checked on every reachable state and every
transition (docs/verification.md's table says each kind). Each check returns
(kind, explanation) pairs; an empty list is safe.
"""
from __future__ import annotations

from bulkhead.protocol.messages import Assign
from bulkhead.protocol.types import Outcome, Phase
from bulkhead.verify.actors.events import Committed, PageRead, WriteLanded
from bulkhead.verify.actors.network import Landing, PageWrite
from bulkhead.verify.actors.values import ZERO, kv_origin
from bulkhead.verify.model import WorldState, in_flight
from bulkhead.verify.world import World


def check_transition(world: World, before: WorldState, after: WorldState, notes, sent=()) -> list:
    tenants = {r.rid: r.tenant for r in world.requests}
    found = [("assigned_to_draining", f"r{m.body.request_id} assigned to draining {m.dst[0]}{m.dst[1]}")
             for m in sent if isinstance(m.body, Assign) and m.dst in after.router.draining]
    for note in notes:
        if isinstance(note, PageRead):
            found += _read(note, tenants)
        elif isinstance(note, WriteLanded) and (note.owner, note.gen) != (note.rid, note.write_gen):
            found.append(("write_on_moved_page",
                          f"r{note.rid}'s write (gen {note.write_gen}) landed on decode{note.decode} "
                          f"page {note.page}, now owner {_who(note.owner)} gen {note.gen}"))
        elif isinstance(note, Committed):
            found += _commit(after, note)
    found += _outcomes_stable(before, after)
    return found


def _who(owner) -> str:
    return "free" if owner is None else f"r{owner}"


def _read(note: PageRead, tenants: dict) -> list:
    own = kv_origin(note.rid, note.epoch)
    if note.content in (ZERO, own):
        return []
    if isinstance(note.content, tuple) and note.content[0] in tenants:
        other = note.content[0]
        if tenants[other] != note.tenant:
            return [("cross_tenant_read", f"r{note.rid} (tenant {note.tenant}) read page {note.page} "
                     f"holding r{other}'s KV (tenant {tenants[other]})")]
    return [("foreign_read", f"r{note.rid} read page {note.page} holding {note.content!r}")]


def _commit(after: WorldState, note: Committed) -> list:
    decode = after.decodes[note.decode]
    record = next(r for r in decode.requests if r.rid == note.rid)
    own = kv_origin(note.rid, note.epoch)
    bad = [p for p in record.prompt_pages
           if decode.ledger.entries[p].content != own or decode.ledger.entries[p].written_epoch != note.epoch]
    if not bad:
        return []
    return [("commit_not_exact", f"decode{note.decode} committed r{note.rid} but pages {bad} do not "
             f"hold its KV from epoch {note.epoch}")]


def _outcomes_stable(before: WorldState, after: WorldState) -> list:
    found = []
    for old, new in zip(_outcomes(before), _outcomes(after)):
        for key, value in old.items():
            if key in new and new[key] != value:
                found.append(("outcome_changed", f"{key} went from {value!r} to {new[key]!r}"))
    return found


def _outcomes(state: WorldState):
    """One dict per actor (same incarnation only): rid -> recorded outcome."""
    yield {("router", r.rid): r.outcome for r in state.router.requests if r.outcome}
    for actor in state.prefills + state.decodes:
        kind = "prefill" if hasattr(actor, "requests") and not hasattr(actor, "ledger") else "decode"
        yield {(kind, actor.index, actor.incarnation, r.rid): r.outcome
               for r in actor.requests if r.outcome}


def check_state(world: World, state: WorldState) -> list:
    found = []
    found += _rejected_clean(state)
    found += _ownership(state)
    rooms = state.router.rooms_in_use()
    if len(rooms) != len(set(rooms)):
        found.append(("room_reused", f"live requests share rooms {sorted(rooms)}"))
    found += _agreement(state)
    for decode in state.decodes:
        for page in decode.ledger.free:
            if decode.ledger.entries[page].content is not ZERO:
                found.append(("free_page_dirty", f"decode{decode.index} free page {page} holds "
                              f"{decode.ledger.entries[page].content!r}"))
    return found


def _rejected_clean(state: WorldState) -> list:
    found = []
    flying = in_flight(state)
    for record in state.router.requests:
        if record.outcome is not Outcome.REJECTED:
            continue
        rid, why = record.rid, []
        if record.room is not None:
            why.append(f"room {record.room}")
        for decode in state.decodes:
            if any(r.rid == rid and r.pages for r in decode.requests):
                why.append(f"pages on decode{decode.index}")
            if any(r.rid == rid and r.phase in (Phase.COMMITTED, Phase.DECODING) for r in decode.requests):
                why.append("a token")
            if any(isinstance(e.content, tuple) and e.content[0] == rid for e in decode.ledger.entries):
                why.append(f"KV on decode{decode.index}")
        for prefill in state.prefills:
            if any(r.rid == rid and r.local_pages for r in prefill.requests):
                why.append(f"pages on prefill{prefill.index}")
        if any(isinstance(m.body, (PageWrite, Landing)) and m.body.request_id == rid for m in flying):
            why.append("a write in flight")
        if why:
            found.append(("rejected_not_clean", f"rejected r{rid} holds " + ", ".join(why)))
    return found


def _ownership(state: WorldState) -> list:
    found = []
    for decode in state.decodes:
        seen = {page: "free" for page in decode.ledger.free}
        if len(seen) != len(decode.ledger.free):
            found.append(("page_owned_twice", f"decode{decode.index} free stack repeats a page"))
        for record in decode.requests:
            for page in record.pages:
                if page in seen:
                    found.append(("page_owned_twice", f"decode{decode.index} page {page} held by "
                                  f"r{record.rid} and {seen[page]}"))
                seen[page] = f"r{record.rid}"
    return found


def _agreement(state: WorldState) -> list:
    router = {r.rid: r.outcome for r in state.router.requests if r.outcome}
    found = []
    for actor in state.prefills + state.decodes:
        name = ("decode" if hasattr(actor, "ledger") else "prefill") + str(actor.index)
        for record in actor.requests:
            if record.outcome is None:
                continue
            expected = router.get(record.rid)
            if expected != record.outcome:
                found.append(("outcome_disagreement", f"r{record.rid}: router says {expected!r}, "
                              f"{name} says {record.outcome!r}"))
    return found


def is_final(world: World, state: WorldState) -> bool:
    """Every request answered, every worker done with it, every page free."""
    answered = {r.rid for r in state.router.requests if r.phase is Phase.DONE}
    if answered != {spec.rid for spec in world.requests}:
        return False
    for prefill in state.prefills:
        # A grant that reached a restarted prefill leaves a record with no
        # ticket and no pages: it holds nothing, so it does not count.
        active = [r for r in prefill.requests if r.phase is not Phase.DONE and r.ticket is not None]
        if prefill.pages_in_use() or active:
            return False
    for decode in state.decodes:
        if len(decode.ledger.free) != len(decode.ledger.entries):
            return False
        if any(r.phase is not Phase.DONE for r in decode.requests):
            return False
    return True
