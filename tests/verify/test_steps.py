"""Unit tests of single transitions: microseconds each, no checker."""
from dataclasses import replace

from bulkhead.protocol.messages import (
    Assign, DrainAck, Finalize, Output, PagesGranted, PrefillFailed, TransferDone, TransferFailed,
)
from bulkhead.protocol.outputs import RequestOutput
from bulkhead.protocol.ticket import SignedTicket, Ticket
from bulkhead.protocol.types import Outcome, Phase
from bulkhead.verify.actors.config import Guards, ProtocolConfig, RequestSpec
from bulkhead.verify.actors.decode import decode_initial, decode_restart, decode_step
from bulkhead.verify.actors.events import (
    DecodeStep, HandedOver, LeaseExpired, PromptFailed, Quiesced, Reserved, Submit,
)
from bulkhead.verify.actors.ledger_model import Ledger
from bulkhead.verify.actors.network import Envelope, Landing, PageWrite
from bulkhead.verify.actors.prefill import PrefillState, prefill_step
from bulkhead.verify.actors.router import RouterState, router_step
from bulkhead.verify.actors.values import GARBAGE, MODEL_MAC, ROUTER, ZERO, decode_addr, kv_origin, prefill_addr

CONFIG = ProtocolConfig(prefill_pools=(4, 2), decode_pools=(4,), context_pages=8, rooms=1)
FITS = RequestSpec(0, "A", prompt_pages=1, decode_pages=1, prefill=0, decode=0)
TOO_LONG = RequestSpec(1, "B", prompt_pages=2, decode_pages=1, prefill=1, decode=0)
TICKET = SignedTicket(Ticket(FITS, room=0, epoch=1), MODEL_MAC)


def to(dst, message, signed=True):
    return Envelope(dst, message, signed)


def finished(rid):
    """Decode's one output in the model: finished, no tokens, no error (the 200)."""
    return to(ROUTER, Output(RequestOutput(rid, (), "", (), True, "length", 0, 0)))


def transfer_done(manifest):
    return to(decode_addr(0), TransferDone(manifest.request_id, manifest, 0, (), None))


def test_router_rejects_over_the_smallest_limit_before_any_room():
    step = router_step(CONFIG, RouterState(), Submit(TOO_LONG))
    record = step.state.requests[0]
    assert record.outcome is Outcome.REJECTED and record.room is None and step.send == ()
    assert "prefill_pool limit 2 pages < 3" in record.detail
    # A rejection is terminal: nothing moves it again.
    again = router_step(CONFIG, step.state, finished(1))
    assert again.state == step.state and again.send == ()


def test_router_bootstraps_and_queues_when_rooms_run_out():
    step = router_step(CONFIG, RouterState(), Submit(FITS))
    assert step.state.requests[0].phase is Phase.BOOTSTRAPPED
    assert {m.dst for m in step.send} == {("prefill", 0), ("decode", 0)}
    second = router_step(CONFIG, step.state, Submit(replace(FITS, rid=2)))
    assert second.state.requests[1].phase is Phase.ADMITTED and second.send == ()
    done = router_step(CONFIG, second.state, finished(0))
    assert done.state.requests[1].phase is Phase.BOOTSTRAPPED  # the room came free
    assert done.state.requests[0].outcome is Outcome.FINISHED
    # A success is not finalized: each worker ends it on its own.
    assert not any(isinstance(m.body, Finalize) for m in done.send)


def test_router_first_outcome_wins():
    state = router_step(CONFIG, RouterState(), Submit(FITS)).state
    failed = router_step(CONFIG, state, to(ROUTER, TransferFailed(0, "digest"))).state
    assert router_step(CONFIG, failed, finished(0)).state == failed


def test_unsigned_messages_are_dropped_only_with_hmac():
    forged = to(decode_addr(0), Assign(0, replace(TICKET, mac="")), signed=False)
    assert decode_step(CONFIG, decode_initial(CONFIG, 0), forged).state.requests == ()
    open_config = replace(CONFIG, guards=Guards().without("hmac"))
    assert decode_step(open_config, decode_initial(open_config, 0), forged).state.requests != ()


def _allocated():
    """A ticket at decode whose reservation has reached the job: granted."""
    state = decode_step(CONFIG, decode_initial(CONFIG, 0), to(decode_addr(0), Assign(0, TICKET))).state
    assert find_phase(state) is Phase.WAITING_PAGES and state.requests[0].reserving
    step = decode_step(CONFIG, state, Reserved(0))
    (grant,) = step.send
    return step.state, grant


def test_a_reservation_the_outcome_overtook_goes_straight_back():
    state = decode_step(CONFIG, decode_initial(CONFIG, 0), to(decode_addr(0), Assign(0, TICKET))).state
    held = state.requests[0].pages
    assert held and all(state.ledger.entries[p].owner == 0 for p in held)  # the engine took them
    state = decode_step(CONFIG, state, to(decode_addr(0), Finalize(0, Outcome.ABORTED))).state
    assert find_phase(state) is Phase.DRAINING  # as if granted: waits for the ack or the lease
    step = decode_step(CONFIG, state, Reserved(0))
    assert step.send == ()  # no writer is ever told of them
    assert len(step.state.ledger.free) == len(step.state.ledger.entries)
    assert find_phase(decode_step(CONFIG, step.state, LeaseExpired(0)).state) is Phase.DONE


def test_decode_allocates_newest_freed_first_and_bumps_generations():
    state, grant = _allocated()
    assert grant.dst == prefill_addr(0) and isinstance(grant.body, PagesGranted) and grant.body.pages == (3,)
    assert grant.body.generations == (1,)
    assert state.ledger.entries[3].gen == 1 and state.ledger.entries[3].owner == 0
    state.ledger.check_integrity()


def _write(state, page, gen, payload=kv_origin(0, 1)):
    write = to(decode_addr(0), PageWrite(0, 0, 1, state.incarnation, page, gen, payload))
    step = decode_step(CONFIG, state, write)
    if not step.send:
        return state, None
    return decode_step(CONFIG, step.state, step.send[0]).state, step.send[0]


def _manifest_for(page, payload=kv_origin(0, 1)):
    from bulkhead.protocol.manifest import Manifest
    from bulkhead.verify.actors.values import digest_of
    return Manifest(0, "A", 0, 1, 0, 1, (page,), (), (digest_of(payload),))


def test_commit_waits_for_coverage_then_commits():
    state, _ = _allocated()
    step = decode_step(CONFIG, state, transfer_done(_manifest_for(3)))
    assert find_phase(step.state) is Phase.DECODE_ALLOCATED  # the write has not landed
    state, landing = _write(step.state, 3, 1)
    assert isinstance(landing.body, Landing) and find_phase(state) is Phase.COMMITTED


def test_corrupt_payload_fails_closed():
    state, _ = _allocated()
    state, _ = _write(state, 3, 1, payload=GARBAGE)
    step = decode_step(CONFIG, state, transfer_done(_manifest_for(3)))
    # Drains at once: no commit can follow; the router's Finalize changes nothing.
    assert isinstance(step.send[0].body, TransferFailed) and find_phase(step.state) is Phase.DRAINING
    late = decode_step(CONFIG, step.state, to(decode_addr(0), Finalize(0, Outcome.TRANSFER_FAILED)))
    assert late.state == step.state and late.send == ()
    freed = decode_step(CONFIG, step.state, to(decode_addr(0), DrainAck(0))).state
    assert find_phase(freed) is Phase.DONE and freed.ledger.entries[3].content is ZERO


def test_a_failed_check_after_prefills_ack_frees_the_pages_at_once():
    state, _ = _allocated()
    state, _ = _write(state, 3, 1, payload=GARBAGE)
    state = decode_step(CONFIG, state, to(decode_addr(0), DrainAck(0))).state  # prefill's writes had ended
    step = decode_step(CONFIG, state, transfer_done(_manifest_for(3)))
    assert isinstance(step.send[0].body, TransferFailed)
    assert find_phase(step.state) is Phase.DONE and len(step.state.ledger.free) == len(step.state.ledger.entries)


def test_manifest_that_differs_from_the_allocation_fails():
    state, _ = _allocated()
    step = decode_step(CONFIG, state, transfer_done(_manifest_for(2)))
    assert isinstance(step.send[0].body, TransferFailed)


def test_stale_generation_write_is_refused():
    state, _ = _allocated()
    assert _write(state, 3, gen=0)[1] is None


def test_pages_wait_for_drain_then_are_scrubbed():
    state, _ = _allocated()
    state, _ = _write(state, 3, 1)
    state = decode_step(CONFIG, state, to(decode_addr(0), Finalize(0, Outcome.ABORTED))).state
    assert find_phase(state) is Phase.DRAINING and 3 not in state.ledger.free
    state = decode_step(CONFIG, state, to(decode_addr(0), DrainAck(0))).state
    assert find_phase(state) is Phase.DONE and state.ledger.entries[3].content is ZERO
    assert state.ledger.free[-2:] == (2, 3)  # the block comes back in the same order


def test_lease_expiry_also_releases():
    state, _ = _allocated()
    state = decode_step(CONFIG, state, to(decode_addr(0), Finalize(0, Outcome.TIMED_OUT))).state
    assert find_phase(decode_step(CONFIG, state, LeaseExpired(0)).state) is Phase.DONE


def test_decode_step_reads_own_pages_and_the_last_token_frees_them():
    state, _ = _allocated()
    state, _ = _write(state, 3, 1)
    state = decode_step(CONFIG, state, transfer_done(_manifest_for(3))).state
    step = decode_step(CONFIG, state, DecodeStep(0))
    assert {n.content for n in step.notes} == {kv_origin(0, 1)} and step.send == ()
    last = decode_step(CONFIG, step.state, DecodeStep(0, last=True))
    (done,) = last.send
    assert done.dst == ROUTER and isinstance(done.body, Output) and done.body.output.finished
    # The success path: no Finalize, no drain ack awaited; scrubbed and free.
    assert find_phase(last.state) is Phase.DONE
    assert all(last.state.ledger.entries[p].content is ZERO for p in (2, 3))
    assert len(last.state.ledger.free) == len(last.state.ledger.entries)
    # An abort that comes after it, and prefill's ack, change nothing.
    for late in (Finalize(0, Outcome.ABORTED), DrainAck(0)):
        after = decode_step(CONFIG, last.state, to(decode_addr(0), late))
        assert after.state == last.state and after.send == ()


def test_prefill_acks_as_its_writes_end_before_any_outcome():
    """The success path: every write was posted at once, so once they have
    ended prefill acks (the router sends no Finalize after a success)."""
    state = _prefilled()
    state = prefill_step(CONFIG, state, _allocated()[1]).state
    assert find_phase(state) is Phase.TRANSFERRING and state.pages_in_use() == 1
    step = prefill_step(CONFIG, state, Quiesced(0))
    assert step.send == (to(ROUTER, DrainAck(0)),)
    assert find_phase(step.state) is Phase.DONE and step.state.pages_in_use() == 0
    late = prefill_step(CONFIG, step.state, to(prefill_addr(0), Finalize(0, Outcome.ABORTED)))
    assert late.state == step.state and late.send == ()


def test_restart_keeps_memory_but_scrubs_it():
    state, _ = _allocated()
    state, _ = _write(state, 3, 1)
    fresh = decode_restart(CONFIG, state)
    assert fresh.incarnation == 2 and fresh.requests == () and fresh.ledger.entries[3].content is ZERO


def _prefilled():
    """A ticket at prefill whose engine has handed the prompt's KV over."""
    state = prefill_step(CONFIG, PrefillState(0), to(prefill_addr(0), Assign(0, TICKET))).state
    assert find_phase(state) is Phase.WAITING_POOL and state.requests[0].computing
    return prefill_step(CONFIG, state, HandedOver(0)).state


def test_a_prompt_handed_over_after_the_outcome_goes_straight_back():
    state = prefill_step(CONFIG, PrefillState(0), to(prefill_addr(0), Assign(0, TICKET))).state
    state = prefill_step(CONFIG, state, to(prefill_addr(0), Finalize(0, Outcome.ABORTED))).state
    assert find_phase(state) is Phase.DRAINING and state.pages_in_use() == 1  # the engine still has it
    step = prefill_step(CONFIG, state, HandedOver(0))
    assert step.send == (to(ROUTER, DrainAck(0)),)  # nothing was posted: acked at once
    assert find_phase(step.state) is Phase.DONE and step.state.pages_in_use() == 0


def test_a_prompt_the_engine_fails_is_reported_and_acked():
    state = prefill_step(CONFIG, PrefillState(0), to(prefill_addr(0), Assign(0, TICKET))).state
    step = prefill_step(CONFIG, state, PromptFailed(0))
    assert [(m.dst, type(m.body)) for m in step.send] == [(ROUTER, PrefillFailed), (ROUTER, DrainAck)]
    assert find_phase(step.state) is Phase.DONE and step.state.pages_in_use() == 0
    # The router fails the request; its Finalize changes nothing here.
    late = prefill_step(CONFIG, step.state, to(prefill_addr(0), Finalize(0, Outcome.PREFILL_FAILED)))
    assert late.state == step.state and late.send == ()


def test_prefill_posts_every_granted_page_then_acks_drain():
    state = _prefilled()
    grant = _allocated()[1]
    step = prefill_step(CONFIG, state, grant)
    assert [type(m.body).__name__ for m in step.send] == ["PageWrite", "TransferDone"]
    state = prefill_step(CONFIG, step.state, to(prefill_addr(0), Finalize(0, Outcome.FINISHED))).state
    # After the outcome, a late grant is never acted on.
    assert prefill_step(CONFIG, state, grant).send == ()
    step = prefill_step(CONFIG, state, Quiesced(0))
    # To the router, which relays it to the pair's decode (the checker's network does it in one step).
    assert step.send == (to(ROUTER, DrainAck(0)),) and step.state.pages_in_use() == 0


def test_ledger_allocation_is_lifo():
    ledger, first = Ledger.fresh(4).allocate(7, 2)
    ledger = ledger.release(first, scrub=True)
    assert ledger.allocate(8, 2)[1] == first


def find_phase(state):
    return state.requests[0].phase


def test_an_ack_before_the_outcome_lets_decode_free_at_the_outcome():
    state, _ = _allocated()
    state, _ = _write(state, 3, 1)
    state = decode_step(CONFIG, state, to(decode_addr(0), DrainAck(0))).state
    assert find_phase(state) is Phase.DECODE_ALLOCATED and state.requests[0].drain_acked
    state = decode_step(CONFIG, state, to(decode_addr(0), Finalize(0, Outcome.ABORTED))).state
    assert find_phase(state) is Phase.DONE and state.ledger.entries[3].content is ZERO and 3 in state.ledger.free



def test_a_later_decode_step_reads_every_page_again_and_changes_nothing():
    state, _ = _allocated()
    state, _ = _write(state, 3, 1)
    state = decode_step(CONFIG, state, transfer_done(_manifest_for(3))).state
    state = decode_step(CONFIG, state, DecodeStep(0)).state
    assert find_phase(state) is Phase.DECODING
    later = decode_step(CONFIG, state, DecodeStep(0))
    assert later.state == state and later.send == ()
    assert {(n.page, n.content) for n in later.notes} == {(3, kv_origin(0, 1)), (2, kv_origin(0, 1))}


def test_a_lease_timer_that_fires_after_the_ack_changes_nothing():
    state, _ = _allocated()
    state = decode_step(CONFIG, state, to(decode_addr(0), Finalize(0, Outcome.ABORTED))).state
    state = decode_step(CONFIG, state, to(decode_addr(0), DrainAck(0))).state
    assert find_phase(state) is Phase.DONE
    late = decode_step(CONFIG, state, LeaseExpired(0))
    assert late.state == state and late.send == () and late.notes == ()


def test_a_transfer_that_fails_with_a_write_in_flight_is_never_acked():
    """The runtime's undrained step, now the model's (a fault): prefill
    reports the failure, frees its pages, and never acks; decode's lease
    fences the write that may still land."""
    from bulkhead.verify.actors.events import WriteFailed
    state = _prefilled()
    state = prefill_step(CONFIG, state, _allocated()[1]).state
    assert find_phase(state) is Phase.TRANSFERRING
    step = prefill_step(CONFIG, state, WriteFailed(0))
    assert [(m.dst, type(m.body)) for m in step.send] == [(ROUTER, TransferFailed)]
    assert find_phase(step.state) is Phase.DONE and step.state.pages_in_use() == 0
    for later in (to(prefill_addr(0), Finalize(0, Outcome.TRANSFER_FAILED)), Quiesced(0)):
        after = prefill_step(CONFIG, step.state, later)
        assert after.state == step.state and after.send == ()  # no ack, ever


def test_an_abort_of_a_committed_request_is_the_engines_to_end():
    """A committed request has no drain: its Finalize leaves the phase and
    asks the engine to end it; that last step frees the pages (no write is
    admitted after the commit), and its output changes nothing at the router."""
    state, _ = _allocated()
    state, _ = _write(state, 3, 1)
    state = decode_step(CONFIG, state, transfer_done(_manifest_for(3))).state
    state = decode_step(CONFIG, state, DecodeStep(0)).state
    step = decode_step(CONFIG, state, to(decode_addr(0), Finalize(0, Outcome.ABORTED)))
    assert find_phase(step.state) is Phase.DECODING and step.send == ()
    assert step.state.requests[0].outcome is Outcome.ABORTED
    ended = decode_step(CONFIG, step.state, DecodeStep(0, last=True))
    assert find_phase(ended.state) is Phase.DONE and len(ended.state.ledger.free) == len(ended.state.ledger.entries)
    assert ended.state.requests[0].outcome is Outcome.ABORTED  # the router's outcome, kept for the audit
