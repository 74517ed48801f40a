"""bench/context_switches.py's /proc readings and arithmetic (the load it drives is bench/peers.py's)."""

import os
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import context_switches as cs  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="no /proc")


def test_it_reads_every_thread_of_a_process_and_counts_a_blocked_one():
    started, release = threading.Event(), threading.Event()

    def blocked():
        started.set()
        release.wait()  # blocks on a lock: voluntary switches

    t = threading.Thread(target=blocked)
    t.start()
    started.wait()
    try:
        # started is set just before the thread blocks: on a loaded machine it
        # may not have blocked yet, so read until it has (bounded).
        for _ in range(500):
            counters = cs.thread_counters(os.getpid())
            if counters.get(t.native_id) and counters[t.native_id].voluntary >= 1:
                break
            time.sleep(0.01)
        assert t.native_id in counters and threading.main_thread().native_id in counters
        assert counters[t.native_id].voluntary >= 1
        assert all(c.voluntary >= 0 and c.involuntary >= 0 and c.cpu_s >= 0 for c in counters.values())
    finally:
        release.set()
        t.join()


def test_a_level_counts_what_changed_and_threads_born_during_it_from_zero():
    before = {1: cs.Counters(10, 5, 1.0), 2: cs.Counters(3, 3, 0.5)}
    after = {1: cs.Counters(15, 6, 1.5), 2: cs.Counters(3, 4, 0.5), 3: cs.Counters(2, 1, 0.25)}
    assert cs.level_counters(before, after) == cs.Counters(7, 3, 0.75)


def test_a_process_it_cannot_read_gives_no_threads():
    assert cs.thread_counters(2**31 - 1) == {}


def test_role_names_the_router_and_its_workers():
    serve = ["python", "-m", "bulkhead.cli", "serve"]
    assert cs.role_of([*serve, "--role", "local", ""], is_root=True) == "router"
    assert cs.role_of([*serve, "--role", "decode", ""], is_root=False) == "decode"
    assert cs.role_of([*serve, "--model", "x", ""], is_root=True) == "server"


def test_role_reads_a_live_process_and_names_a_gone_one_by_its_pid():
    assert cs.role(os.getpid(), root=-1) == "server"  # pytest's command line has no --role
    assert cs.role(2**31 - 1, root=-1) == str(2**31 - 1)
