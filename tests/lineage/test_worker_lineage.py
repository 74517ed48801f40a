"""Decode's grant, commit and refusal reach the lineage log with the
manifest's digest (the worker's handlers driven by hand, no sockets)."""

import json
import threading
from concurrent.futures import Future

import pytest

from bulkhead.disagg import messages as m
from bulkhead.disagg.decode_worker import DecodeJob, DecodeWorker
from bulkhead.disagg.signing import Signer
from bulkhead.engine.builder import EngineConfig, build_engine
from bulkhead.engine.commands import PageFacts
from bulkhead.lineage.writer import LineageLog
from bulkhead.protocol.lifecycle import Event
from bulkhead.protocol.manifest import Manifest
from tests.disagg.tickets import make_ticket


class FakeTarget:
    name = "fake"

    def __init__(self):
        self.write_lock = threading.Lock()

    def set_write_guard(self, guard):
        pass

    def descriptor(self):
        return {}


def done(value) -> Future:
    f = Future()
    f.set_result(value)
    return f


@pytest.fixture
def decode(tiny_model_dir, tmp_path):
    log = LineageLog(tmp_path / "l.jsonl", bytes(32), flush_interval_s=3600)
    built = build_engine(EngineConfig(tiny_model_dir, "tiny", 8 * 2**20), lineage=log)
    worker = DecodeWorker(built, "tiny", Signer(b"k" * 32, "decode-0"), "tcp://127.0.0.1:1", target=FakeTarget())
    worker.send = lambda message: None
    yield worker, built, log
    log.close()


def grant(worker, built, rid):
    ticket = make_ticket(rid)
    job = DecodeJob(ticket)
    job.advance(Event.ASSIGN)
    worker.jobs[rid] = job
    pages = built.engine.reserve(rid, "alpha", 1)
    worker._granted(rid, done((pages, [built.engine.ledger.generation(p) for p in pages])))
    return ticket, job


def records(log, kind):
    log.flush()
    return [json.loads(line) for line in log.path.read_text().splitlines() if f'"kind":"{kind}"' in line]


@pytest.mark.parametrize("digest_ok", [True, False])
def test_grant_and_commit_or_refusal_are_recorded_with_the_manifest_digest(decode, digest_ok):
    worker, built, log = decode
    ticket, job = grant(worker, built, "r1")
    [g] = records(log, "grant")
    assert (g["request"], g["tenant"], g["pages"], g["gens"]) == ("r1", "alpha", list(job.alloc.pages),
                                                                  list(job.alloc.generations))
    a = job.alloc
    manifest = Manifest("r1", "alpha", a.room, a.epoch, 0, a.token_count, a.pages, a.generations, (5,))
    facts = PageFacts(("r1",), a.generations, (5 if digest_ok else 6,))
    worker._checked("r1", job, m.TransferDone("r1", manifest, 1, (), None), done(facts))
    if digest_ok:
        [c] = records(log, "commit")
        assert c["manifest"] == manifest.digest() and c["pages"] == list(a.pages) and not records(log, "refuse")
    else:
        [r] = records(log, "refuse")
        assert r["manifest"] == manifest.digest() and "digest" in r["reason"] and not records(log, "commit")
