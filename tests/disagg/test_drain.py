"""Drain and resume at the router (the operator's, and a worker's SIGTERM),
and a worker's side of it: no new request to a draining worker, the last
worker of a role refused unless forced, no assign after the Drain, and a
leaving worker that stops only once it holds nothing."""
import time

import pytest

from bulkhead.disagg import messages as m
from bulkhead.disagg.decode_worker import DecodeJob, DecodeWorker
from bulkhead.disagg.prefill_worker import PrefillWorker
from bulkhead.disagg.router import DisaggBackend
from bulkhead.disagg.signing import Signer
from bulkhead.errors import Conflict, NotFound, Overloaded
from bulkhead.protocol.lifecycle import Event
from bulkhead.seams import Seams
from tests.disagg.test_decode_guard import FakeTarget
from tests.disagg.test_messages import RecordingLink, RecordingRouterLink
from tests.disagg.tickets import make_ticket

KEY = b"k" * 32


@pytest.fixture
def router(make_engine):
    """A router with prefill-0, prefill-1 and decode-0 registered."""
    r = DisaggBackend(None, "tiny", Signer(KEY, "router"), "tcp://127.0.0.1:1", "api_keys",
                      make_link=RecordingRouterLink)
    engine = make_engine()
    for name in ("prefill-0", "prefill-1"):
        w = PrefillWorker(engine, "tiny", Signer(KEY, name), "tcp://127.0.0.1:1", seams=Seams(make_link=RecordingLink))
        r._register(name, m.Register(w.info(), None), "inc-1")
    d = DecodeWorker(engine, "tiny", Signer(KEY, "decode-0"), "tcp://127.0.0.1:1", target=FakeTarget(),
                     seams=Seams(make_link=RecordingLink))
    r._register("decode-0", m.Register(d.info(), d.transfer_endpoint()), "inc-1")
    r.link.sent.clear()
    return r


def _sent(router, worker):
    return [m.decode(body) for name, body in router.link.sent if name == worker]


def test_a_drained_worker_is_never_picked_and_hears_drain(router):
    router.drain("prefill-0")
    assert _sent(router, "prefill-0") == [m.Drain()]
    for _ in range(5):
        prefill, decode = router._pair()
        assert prefill.name == "prefill-1"
    states = {w["name"]: w["state"] for w in router.worker_states()}
    assert states == {"prefill-0": "draining", "prefill-1": "live", "decode-0": "live"}


def test_resume_makes_it_assignable_again(router):
    router.drain("prefill-0")
    router.drain("prefill-1", force=True)
    with pytest.raises(Overloaded):
        router._pair()
    router.resume("prefill-0")
    assert router._pair()[0].name == "prefill-0"
    assert _sent(router, "prefill-0")[-1] == m.Resume()


def test_the_last_worker_of_a_role_is_refused_unless_forced(router):
    with pytest.raises(Conflict) as refused:
        router.drain("decode-0")
    assert refused.value.code == "last_worker_of_role" and "force" in refused.value.message
    assert router.registry.is_assignable("decode-0") and _sent(router, "decode-0") == []
    router.drain("decode-0", force=True)
    assert not router.registry.is_assignable("decode-0")


def test_an_unknown_worker_is_a_typed_404(router):
    with pytest.raises(NotFound) as e:
        router.drain("prefill-9")
    assert (e.value.status, e.value.code, e.value.value) == (404, "worker_not_found", "prefill-9")
    with pytest.raises(NotFound):
        router.resume("prefill-9")


def test_a_leaving_worker_is_drained_even_if_it_is_the_last_of_its_role(router):
    worker = router.registry.heard_from("decode-0")
    router._on_leaving("decode-0", worker, m.Leaving())
    assert _sent(router, "decode-0") == [m.Drain()]


def test_a_drained_worker_that_leaves_fails_no_route(router):
    # Its part of every request it served is over (it held nothing): a
    # decode still streaming a request whose prefill left is not failed.
    router.drain("prefill-0")
    worker = router.registry.workers["prefill-0"]
    worker.info = {**worker.info, "drained": True}
    failed = []
    router._fail = lambda rid, error, outcome: failed.append(rid)
    router._routes_of = lambda name: ["r1"]
    for w in router.registry.workers.values():
        w.last_seen = time.monotonic()
    worker.last_seen -= 60
    router._on_tick()
    assert failed == [] and "prefill-0" not in router.registry.workers


@pytest.fixture
def decode(make_engine):
    return DecodeWorker(make_engine(), "tiny", Signer(KEY, "decode-0"), "tcp://127.0.0.1:1", target=FakeTarget(),
                        seams=Seams(make_link=RecordingLink))


def test_a_leaving_worker_announces_then_stops_only_when_it_holds_nothing(decode):
    stopped = []
    decode.stop = lambda: stopped.append(True)
    decode.registered = True
    job = DecodeJob(make_ticket())
    job.advance(Event.ASSIGN)
    decode.jobs["r1"] = job
    decode.leave(60.0)
    decode.on_tick()
    assert m.Leaving() in [m.decode(b) for b in decode.link.sent]
    decode.on_message(m.encode(m.Drain()))
    assert decode.draining and decode.info()["drained"] is False
    decode.on_tick()
    assert stopped == []  # r1 is still held
    decode.jobs.clear()
    assert decode.info()["drained"] is True
    decode.on_tick()
    assert stopped == [True]


def test_a_leaving_worker_goes_at_its_deadline_holding_work(decode):
    stopped = []
    decode.stop = lambda: stopped.append(True)
    decode.registered = True
    decode.jobs["r1"] = DecodeJob(make_ticket())
    decode.leave(0.0)
    decode.on_tick()
    decode.on_message(m.encode(m.Drain()))
    decode.on_tick()
    assert stopped == [True] and decode.counters["drain_deadline_passed"] == 1
