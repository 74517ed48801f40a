"""The phase-transition table (bulkhead/protocol/lifecycle.py): the model
checker takes exactly its rows, a step outside it raises, and the runtime
fails a request closed when one is attempted."""
import re
from dataclasses import replace
from pathlib import Path

import pytest

from bulkhead.disagg.decode_worker import DecodeWorker
from bulkhead.disagg.signing import Signer
from bulkhead.disagg.ticket import sign, signed_ticket_to_dict
from bulkhead.protocol import decode_job, lifecycle, prefill_job, router_job
from bulkhead.protocol.lifecycle import Actor, Event, IllegalTransition, advance
from bulkhead.protocol.types import Phase
from bulkhead.seams import Seams
from bulkhead.verify.actors import decode as model_decode, prefill as model_prefill, router as model_router
from bulkhead.verify.actors.config import Guards, Variant
from bulkhead.verify.checker import explore
from bulkhead.verify.world import default_world, small_world
from tests.disagg.test_decode_guard import FakeTarget
from tests.disagg.tickets import make_ticket

ROOT = Path(__file__).resolve().parents[2]
STEP_MODULES = (model_router, model_prefill, model_decode)
# Where the step functions' phase changes are made: the transition functions
# the runtime calls too.
JOB_MODULES = (router_job, prefill_job, decode_job)

# The default bound's requests, made to reach every row in seconds: one room
# (r1 waits ADMITTED while r0 holds it), a 3-page decode pool (r1 waits for
# pages while r0 drains), r2 over its prefill pool (rejected), and one fault:
# a client abort (a Finalize can overtake an Assign) or a transfer that fails
# with a write in flight (prefill's undrained rows). The default
# bound itself takes every row but two: its two admitted requests never wait
# for a room or for decode pages, so it never finalizes one that is waiting.
EVERY_ROW = replace(default_world(), name="every row", decode_pools=(3, 6), rooms=1,
                    fault_kinds=frozenset({"abort", "fail_write"}))
# A success sends no Finalize, so a prefill DRAINING with a write still in
# flight takes an abort mid-transfer, and its failed write a second fault;
# a failed check takes a corrupted write, a failed prompt its own fault.
# One request, two faults (a few hundred states).
TWO_FAULTS = replace(small_world(), name="two faults, one request",
                     requests=small_world().requests[:1], faults=2,
                     fault_kinds=frozenset({"abort", "fail_write", "corrupt", "fail_prompt"}))


def _key(row):
    return (row.actor, row.src, row.event)


def test_an_exhaustive_search_takes_every_protocol_row_and_no_other(monkeypatch):
    # Containment holds for every search: a step outside the table raises
    # (so tests/verify and `bulkhead verify` prove it at their bounds).
    # This adds that no row is dead.
    taken = set()

    def recording(actor, phase, event, **kwargs):
        taken.add((actor, phase, event))
        return advance(actor, phase, event, **kwargs)

    for module in JOB_MODULES:
        monkeypatch.setattr(module, "advance", recording)
    for world in (EVERY_ROW, TWO_FAULTS):
        result = explore(world, world.protocol(Guards(), Variant.REAL), liveness=False)
        assert result.complete and result.ok, result.violations
    assert taken == {_key(row) for row in lifecycle.rows()}


def test_step_functions_set_phases_only_through_the_table():
    # What makes the search above exercise the table: no step function
    # writes a phase literal into a record.
    for module in STEP_MODULES + JOB_MODULES:
        source = Path(module.__file__).read_text()
        assert not re.search(r"phase=Phase\.|Request\([^)\n]*Phase\.", source), module.__name__


@pytest.mark.parametrize("actor, phase, event", [
    (Actor.DECODE, Phase.DRAINING, Event.MANIFEST_VERIFIED),   # commit after failure (or finalize)
    (Actor.DECODE, Phase.COMMITTED, Event.MANIFEST_VERIFIED),  # a second commit
    (Actor.DECODE, Phase.DECODE_ALLOCATED, Event.PAGES_GRANTED),  # a second grant
    (Actor.DECODE, Phase.DONE, Event.DRAIN_ACK),               # pages freed twice
    (Actor.PREFILL, Phase.DRAINING, Event.PAGES_GRANTED),      # transfer after finalize
    (Actor.PREFILL, Phase.DONE, Event.PAGES_GRANTED),          # transfer after the drain
    (Actor.ROUTER, Phase.DONE, Event.FINALIZE),                # a second outcome
    (Actor.ROUTER, None, Event.BOOTSTRAP),                     # a room before admission
])
def test_a_step_outside_the_table_raises_naming_actor_phase_and_event(actor, phase, event):
    with pytest.raises(IllegalTransition) as raised:
        advance(actor, phase, event)
    message = str(raised.value)
    assert actor.value in message and (phase.name if phase else "-") in message and event.value in message
    assert (raised.value.actor, raised.value.phase, raised.value.event) == (actor, phase, event)


def test_done_is_terminal_and_every_phase_reaches_it():
    table = lifecycle.rows()
    assert not [row for row in table if row.src is Phase.DONE]
    for actor in Actor:
        edges = [(row.src, row.dst) for row in table if row.actor is actor]
        reaches_done = {Phase.DONE}
        while True:
            more = {src for src, dst in edges if dst in reaches_done} - reaches_done
            if not more:
                break
            reaches_done |= more
        assert {src for src, _ in edges} <= reaches_done, actor


def test_docs_show_the_table_as_it_is():
    assert lifecycle.format_table() in (ROOT / "docs/verification.md").read_text()


# -- the runtime: an illegal step fails the request closed ------------------

class RecordingLink:
    def __init__(self, *args, **kwargs):
        self.sent = []

    def send(self, msg):
        self.sent.append(msg)

    def kinds(self):
        return [m["kind"] for m in self.sent]


@pytest.fixture
def decode(make_engine):
    built = make_engine()
    signer = Signer(b"k" * 32, "decode-0")
    worker = DecodeWorker(built, "tiny", signer, "tcp://127.0.0.1:1", target=FakeTarget(),
                          seams=Seams(make_link=RecordingLink))
    ticket = sign(make_ticket(), signer.key)
    worker.on_message({"kind": "assign", "request_id": "r1", "ticket": signed_ticket_to_dict(ticket)})
    return worker


def test_a_second_grant_fails_the_request_closed_and_pages_wait_for_the_drain_ack(decode):
    worker, engine = decode, decode.engine
    # prefill_ready twice while the first reservation is still queued on the
    # engine thread: two reservations asked for one job. The scheduler holds
    # one WAITING_FOR_REMOTE_KV reservation per request and refuses the
    # second, and the request fails closed.
    worker.on_message({"kind": "prefill_ready", "request_id": "r1"})
    worker.on_message({"kind": "prefill_ready", "request_id": "r1"})
    engine.run_until_idle()
    assert worker.counters.get("illegal_transitions") == 1
    assert worker.link.kinds().count("pages_granted") == 1  # the second grant never reached prefill
    (failed,) = [m for m in worker.link.sent if m["kind"] == "transfer_failed"]
    assert failed["code"] == "kv_transfer_failed" and "second page reservation" in failed["reason"]
    job = worker.jobs["r1"]
    assert job.phase is Phase.DRAINING
    assert not worker._write_allowed(job.alloc.pages[0], job.alloc.generations[0], "r1")
    # Fail closed: the pages stay the request's until prefill's drain ack.
    held = engine.ledger.pages_of("r1")
    assert held == list(job.alloc.pages)  # the first grant's, and no second set
    worker.on_tick()
    engine.run_until_idle()
    assert engine.ledger.pages_of("r1") == held
    worker.on_message({"kind": "drain_ack", "request_id": "r1"})
    engine.run_until_idle()
    assert engine.ledger.pages_of("r1") == [] and "r1" not in worker.jobs
