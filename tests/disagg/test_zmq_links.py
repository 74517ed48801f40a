"""The control plane's ZeroMQ links: a send wakes its link thread, and an
idle link sleeps between ticks (bulkhead/disagg/zmq_links.py says why)."""

import threading
import time

import pytest

from bulkhead.disagg import zmq_links
from bulkhead.disagg.signing import Signer
from bulkhead.disagg.zmq_links import RouterLink, WorkerLink
from tests.server_process import free_port

KEY = b"k" * 32


@pytest.fixture
def pair():
    address = f"tcp://127.0.0.1:{free_port()}"
    router = RouterLink(Signer(KEY, "router"), address, on_undeliverable=lambda worker, message: None)
    worker = WorkerLink(Signer(KEY, "prefill-0"), address)
    yield router, worker
    worker.stop()
    router.stop()


def test_a_send_goes_out_at_once_not_at_the_next_tick(pair, monkeypatch):
    # With ticks an hour apart, only the wake-up can carry the message.
    monkeypatch.setattr(zmq_links, "TICK_S", 3600.0)
    router, worker = pair
    got = threading.Event()
    router.start(lambda sender, message: got.set() if message.get("kind") == "hello" else None, lambda: None)
    worker.start(lambda message: None, lambda: None)
    for _ in range(100):  # its first tick has run, and its thread sleeps until woken
        if worker.polls:
            break
        time.sleep(0.01)
    time.sleep(0.1)
    worker.send({"kind": "hello"})
    assert got.wait(5)


def test_an_idle_link_wakes_about_once_a_tick(pair):
    # It used to poll every 2 ms (500 wake-ups a second), and a timeout
    # under a millisecond spun: zmq takes whole milliseconds.
    router, _ = pair
    start = time.monotonic()
    router.start(lambda sender, message: None, lambda: None)
    time.sleep(0.5)
    polls, ticks = router.polls, (time.monotonic() - start) / zmq_links.TICK_S
    assert polls <= 2 * ticks + 5, (polls, ticks)
