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


def _transfer_done(worker, job):
    """A manifest that describes the allocation exactly, with the pool's own digests."""
    from bulkhead.disagg import messages as m
    from bulkhead.kv.digest import page_digests
    from bulkhead.protocol.manifest import Manifest

    a = job.alloc
    digests = tuple(page_digests(worker.engine.pool, list(a.pages)))
    manifest = Manifest(a.request_id, a.tenant, a.room, a.epoch, 0, a.token_count, a.pages, a.generations, digests)
    return m.TransferDone(a.request_id, manifest, 7, (), None)


@pytest.mark.parametrize("page_moved", [False, True])
def test_the_commit_check_reads_owners_generations_and_digests_on_the_engine(decode, page_moved):
    # The coverage check runs on facts the engine thread read (ReadPages). A
    # page that left the request without a new generation (donated to the
    # prefix cache keeps its generation) must still refuse the commit.
    worker, target, job, pages, gens = decode
    sent = []
    worker.send = sent.append
    if page_moved:
        worker.engine.ledger.donate("r1", pages[0], "<prefix-cache>")
    worker._verify_and_commit(_transfer_done(worker, job))
    worker.engine.run_until_idle()
    failed = [msg for msg in sent if msg.kind == "transfer_failed"]
    if page_moved:
        assert failed and "no longer owned" in failed[0].reason
        assert worker.counters.get("commits", 0) == 0
    else:
        assert not failed and worker.counters.get("commits") == 1
