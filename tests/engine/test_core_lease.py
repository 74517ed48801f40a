"""The core lease (bulkhead.engine.core_lease): one model pass at a time
among the workers of a host, reentrant within a process, released by a
holder's death."""

import fcntl
import os
import stat
import subprocess
import sys
import threading

from bulkhead.engine.core_lease import CoreLease
from tests.engine.test_engine import Collector, assert_clean, prompts, submit


def free(path) -> bool:
    """Whether another process's lease could be taken now (a fresh open
    file: flock's lock belongs to the open file, not the process)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing releases what was taken
    return True


def taker(path) -> tuple[threading.Thread, threading.Event]:
    """A thread that takes a second lease on path (its own open file) and
    sets the event once it holds it."""
    got = threading.Event()

    def take():
        other = CoreLease(path)
        with other:
            got.set()
        other.close()

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread, got


def test_a_held_lease_keeps_the_other_worker_waiting_until_it_is_released(tmp_path):
    path = tmp_path / "lease"
    lease = CoreLease(path)
    with lease:
        thread, got = taker(path)
        assert not got.wait(0.3)  # still waiting on this holder
    thread.join(10)
    assert got.is_set() and lease.acquired == 1
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    lease.close()


def test_a_nested_pass_keeps_the_lease_until_the_outer_pass_ends(tmp_path):
    # Interjection runs a pass between the layers of another: the inner one
    # ending must not hand the cores to the other worker mid-pass.
    path = tmp_path / "lease"
    lease = CoreLease(path)
    with lease:
        with lease:
            pass
        assert not free(path)
    assert free(path) and lease.acquired == 1
    lease.close()


def test_a_dead_holders_lease_is_free(tmp_path):
    path = tmp_path / "lease"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from bulkhead.engine.core_lease import CoreLease\n"
        f"lease = CoreLease({str(path)!r}); lease.__enter__(); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not free(path)
    finally:
        holder.kill()
        holder.wait(10)
    assert free(path)


def test_the_engine_holds_the_lease_for_every_model_pass(make_engine, tmp_path):
    path = tmp_path / "lease"
    built, sink = make_engine(core_lease=str(path)), Collector()
    model, held = built.engine.runner.model, []
    real_forward = model.forward

    def forward(batch, layers, between_layers=None):
        held.append(not free(path))
        return real_forward(batch, layers, between_layers)

    model.forward = forward
    for i, prompt in enumerate(prompts(2, length=20)):
        submit(built, sink, f"r{i}", prompt, max_tokens=3)
    built.engine.run_until_idle()
    assert held and all(held)  # prefill passes and decode steps alike
    assert built.engine.runner.lease.acquired == built.engine.stats.steps
    assert free(path)
    assert all(len(sink.tokens(f"r{i}")) == 3 for i in range(2))
    assert_clean(built)


def test_a_requested_turn_is_granted_once_the_other_worker_releases(tmp_path):
    path = tmp_path / "lease"
    other, lease, granted = CoreLease(path), CoreLease(path), threading.Event()
    with other:
        lease.request(granted.set)
        assert not granted.wait(0.3) and not lease.take_turn()
    assert granted.wait(10) and lease.take_turn()
    assert not free(path)  # the turn holds it until it ends
    with lease:  # a pass inside the turn nests, as in `with`
        pass
    assert not free(path)
    lease.end_turn()
    assert free(path) and lease.acquired == 1
    lease.close()
    other.close()


def test_a_served_engine_takes_commands_while_waiting_for_its_turn(make_engine, tmp_path):
    # The decode worker's grants and commits are engine commands: a prompt's
    # hand-over must not wait for the prefill worker's pass to end.
    path = tmp_path / "lease"
    built, sink, other = make_engine(core_lease=str(path)), Collector(), CoreLease(path)
    built.engine.start()
    try:
        with other:  # the other worker's pass
            submit(built, sink, "r0", prompts(1)[0], max_tokens=3)
            for _ in range(200):  # until the engine took the request in: its step is next
                if "r0" in built.engine.scheduler.requests:
                    break
                threading.Event().wait(0.01)
            threading.Event().wait(0.2)  # the engine is at its step now, waiting for its turn
            assert built.engine.call(lambda: "answered").result(timeout=5) == "answered"
            assert not sink.outputs  # no pass of this engine's while the other holds the cores
        deadline = 200
        while len(sink.outputs.get("r0", [])) == 0 or not sink.final("r0").finished:
            deadline -= 1
            assert deadline > 0, "the request did not finish after the lease was released"
            threading.Event().wait(0.05)
        assert len(sink.tokens("r0")) == 3 and built.engine.runner.lease.acquired >= 1
    finally:
        built.engine.stop()
        other.close()
    assert_clean(built)


def test_a_free_lease_is_taken_at_once_and_a_held_one_is_not(tmp_path):
    path = tmp_path / "lease"
    lease, other = CoreLease(path), CoreLease(path)
    with other:
        assert not lease.try_turn() and lease.acquired == 0
    assert lease.try_turn() and not free(path)
    lease.end_turn()
    assert free(path) and lease.acquired == 1
    lease.close()
    other.close()
