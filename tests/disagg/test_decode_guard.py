"""Decode's write guard (what the tcp receiver asks before each page lands)."""

import threading

import pytest

from bulkhead.disagg.signing import Signer
from bulkhead.disagg.decode_worker import DecodeWorker
from bulkhead.protocol.lifecycle import Event
from bulkhead.protocol.manifest import Allocation
from tests.disagg.tickets import make_ticket


class FakeTarget:
    name = "fake"

    def __init__(self):
        self.write_lock = threading.Lock()
        self.guard = None

    def set_write_guard(self, guard):
        self.guard = guard

    def descriptor(self):
        return {}


@pytest.fixture
def decode(make_engine):
    built = make_engine()
    target = FakeTarget()
    worker = DecodeWorker(built, "tiny", Signer(b"k" * 32, "decode-0"), "tcp://127.0.0.1:1", target=target)
    pages = built.engine.reserve("r1", "alpha", 2)
    gens = [built.engine.ledger.generation(p) for p in pages]
    built.engine.reserve("other", "beta", 1)
    ticket = make_ticket()
    from bulkhead.disagg.decode_worker import DecodeJob

    job = DecodeJob(ticket, alloc=Allocation("r1", "alpha", 1, 1, 3, tuple(pages), tuple(gens)))
    job.advance(Event.ASSIGN)
    job.advance(Event.PAGES_GRANTED)
    worker.jobs["r1"] = job
    return worker, target, job, pages, gens


def test_the_guard_is_installed_and_admits_a_granted_page(decode):
    worker, target, job, pages, gens = decode
    assert target.guard is not None
    assert target.guard(pages[0], gens[0], "r1")


def test_a_write_for_another_requests_page_is_refused(decode):
    worker, target, job, pages, gens = decode
    other_page = worker.engine.ledger.pages_of("other")[0]
    assert not target.guard(other_page, worker.engine.ledger.generation(other_page), "r1")


def test_a_write_at_a_stale_generation_is_refused(decode):
    worker, target, job, pages, gens = decode
    assert not target.guard(pages[0], gens[0] - 1, "r1")


@pytest.mark.parametrize("state", ["committed", "failed", "unknown"])
def test_no_write_is_admitted_once_the_request_stopped_waiting_for_kv(decode, state):
    # A late or duplicated write after commit would overwrite verified KV;
    # after a failure it could land while the pages are being freed.
    worker, target, job, pages, gens = decode
    if state == "unknown":
        worker.jobs.clear()
    else:
        job.advance(Event.MANIFEST_VERIFIED if state == "committed" else Event.VERIFY_FAILED)
    assert not target.guard(pages[0], gens[0], "r1")
