"""The core lease (bulkhead.engine.core_lease): one model pass at a time
among the workers of a host, reentrant within a process, released by a
holder's death."""

import fcntl
import os
import queue
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

    def forward(batch, layers):
        held.append(not free(path))
        return real_forward(batch, layers)

    model.forward = forward
    for i, prompt in enumerate(prompts(2, length=20)):
        submit(built, sink, f"r{i}", prompt, max_tokens=3)
    built.engine.run_until_idle()
    assert held and all(held)  # prefill passes and decode steps alike
    assert built.engine.runner.lease.acquired >= 3  # a prefill pass and two decode steps at least
    assert free(path)
    assert all(len(sink.tokens(f"r{i}")) == 3 for i in range(2))
    assert_clean(built)


def turn_of(lease):
    """lease.turn() as a served engine takes it: its thread blocks on a queue
    of commands (here only the wake-up) while it waits."""
    wakes = queue.SimpleQueue()
    return lease.turn(meanwhile=lambda: _drain(wakes), wake=lambda: wakes.put(1),
                      stopped=lambda: False)


def _drain(wakes):
    try:
        wakes.get(timeout=0.05)
    except queue.Empty:
        pass


def test_a_free_lease_is_taken_at_once_and_held_for_the_turn(tmp_path):
    path = tmp_path / "lease"
    lease = CoreLease(path)
    with turn_of(lease) as held:
        assert held and not free(path)
        with lease:  # a pass inside the turn nests
            pass
        assert not free(path)
    assert free(path) and lease.acquired == 1 and lease._waiter is None  # no thread where nobody competes
    lease.close()


def test_a_turn_waits_for_the_other_worker_and_comes_once_it_releases(tmp_path):
    path = tmp_path / "lease"
    other, lease, inside = CoreLease(path), CoreLease(path), threading.Event()

    def step():
        with turn_of(lease) as held:
            assert held
            inside.set()

    with other:
        thread = threading.Thread(target=step, daemon=True)
        thread.start()
        for _ in range(500):
            if lease.waiting:
                break
            threading.Event().wait(0.01)
        assert lease.waiting and not inside.is_set()
    thread.join(10)
    assert inside.is_set() and not lease.waiting and free(path) and lease.acquired == 1
    lease.close()
    other.close()


def test_a_worker_that_gives_up_its_wait_leaves_the_lease_free(tmp_path):
    # A stopped engine, or a command that raised while it waited: a turn
    # granted after it gave up must go back, or the other worker waits forever.
    path = tmp_path / "lease"
    other, lease = CoreLease(path), CoreLease(path)
    with other:
        # Gives up once its waiting thread is waiting on the files (a
        # request never seen by that thread leaves nothing to give back).
        with lease.turn(meanwhile=lambda: threading.Event().wait(0.01), wake=lambda: None,
                        stopped=lambda: lease._busy) as held:
            assert not held
    for _ in range(500):  # the waiting thread takes the lease once other ends, then gives it back
        if not lease._busy and free(path):
            break
        threading.Event().wait(0.01)
    assert free(path) and lease.acquired == 0
    with turn_of(lease) as held:  # and the next turn is a whole one
        assert held and not free(path)
    assert free(path)
    lease.close()
    other.close()


def test_a_free_lease_is_not_taken_at_once_while_another_worker_waits_for_it(tmp_path):
    path = tmp_path / "lease"
    lease = CoreLease(path)
    waiter = os.open(str(path) + ".want", os.O_RDWR)
    fcntl.flock(waiter, fcntl.LOCK_SH)  # another worker says it waits
    try:
        assert free(path) and not lease._try_take() and lease.acquired == 0
    finally:
        os.close(waiter)
    assert lease._try_take() and not free(path)
    lease.__exit__(None, None, None)
    lease.close()


def test_a_worker_asking_again_waits_behind_the_one_already_waiting(tmp_path):
    # flock wakes waiters in no order: without the want file a worker that
    # always has work took the lease back before the woken waiter ran.
    path = tmp_path / "lease"
    first, second, order = CoreLease(path), CoreLease(path), []

    def waiter():
        with turn_of(second) as held:
            order.append(("second", held))

    with turn_of(first):
        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        for _ in range(500):
            if second.waiting and second._busy:
                break
            threading.Event().wait(0.01)
        assert second.waiting
        # first ends its turn and asks again at once: second goes first.
    with turn_of(first) as held:
        order.append(("first", held))
    thread.join(10)
    assert order == [("second", True), ("first", True)]
    first.close()
    second.close()


def test_a_served_engine_takes_commands_while_waiting_for_its_turn(make_engine, tmp_path):
    # The decode worker's grants and commits are engine commands: a prompt's
    # hand-over must not wait for the prefill worker's step to end.
    path = tmp_path / "lease"
    built, sink, other = make_engine(core_lease=str(path)), Collector(), CoreLease(path)
    built.engine.start()
    try:
        with other:  # the other worker's step
            submit(built, sink, "r0", prompts(1)[0], max_tokens=3)
            for _ in range(500):  # until the engine waits for its turn
                if built.engine.runner.lease.waiting:
                    break
                threading.Event().wait(0.01)
            assert built.engine.runner.lease.waiting
            assert built.engine.call(lambda: "answered").result(timeout=10) == "answered"
            assert not sink.outputs and not free(path)  # no step of this engine's while the other holds the cores
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


def test_another_tenants_first_token_that_came_during_a_step_runs_in_the_same_turn(make_engine, tmp_path):
    # Turns alternate: a light prompt that came while a prefill worker's step
    # ran would wait for the decode worker's step (a round of the flood's
    # rows) before its own; the turn runs it at once instead.
    built, sink = make_engine(core_lease=str(tmp_path / "lease")), Collector()
    heavy, light = prompts(2, length=40)
    submit(built, sink, "heavy", heavy, tenant="heavy", max_tokens=8)
    built.engine._take_commands(block=False)
    submit(built, sink, "light", light, tenant="light", max_tokens=2)  # comes during the turn's step
    built.engine._step_in_turn(built.engine.runner.lease)
    assert len(sink.tokens("light")) == 1 and built.engine.runner.lease.acquired == 1
    built.engine.run_until_idle()
    assert_clean(built)


def test_a_tenants_second_request_waits_for_the_next_turn(make_engine, tmp_path):
    # A tenant with a queue of its own is a flood: its prompts take turns.
    built, sink = make_engine(core_lease=str(tmp_path / "lease")), Collector()
    first, second = prompts(2, length=40)
    submit(built, sink, "first", first, tenant="heavy", max_tokens=8)
    built.engine._take_commands(block=False)
    submit(built, sink, "second", second, tenant="heavy", max_tokens=2)
    built.engine._step_in_turn(built.engine.runner.lease)
    assert "second" not in sink.outputs and built.engine.stats.steps == 1
    built.engine.run_until_idle()
    assert_clean(built)


def _prefill_worker_engine(tiny_model_dir, tmp_path):
    from bulkhead.engine.builder import EngineConfig, build_engine

    return build_engine(EngineConfig(model_dir=tiny_model_dir, model_id="tiny", kv_memory_bytes=64 * 2**20,
                                     core_lease=str(tmp_path / "lease")), prefill_only=True)


def assert_handed_over_clean(built, sink):
    """A prefill worker keeps a hand-over's pages for the transfer: give them back, then check."""
    built.engine.run_until_idle()
    for rid in sink.outputs:
        built.engine.release_reserved(rid)
    assert_clean(built)


def hand_over_light_beside_a_flood(built):
    """A light prompt and nine of the flood's short ones (whole passes:
    within a slice): the first step runs the light one and eight others (a
    512-token chunk budget), so the light first token is handed over as the
    step ends, with the ninth still waiting. Returns the hand-overs of the turn."""
    sink = Collector()
    heavy = prompts(9, length=60)
    submit(built, sink, "light", heavy[0][:20], tenant="light", max_tokens=2)
    for i, prompt in enumerate(heavy):
        submit(built, sink, f"heavy{i}", prompt[:60], tenant="heavy", max_tokens=2)
    built.engine._take_commands(block=False)
    built.engine._step_in_turn(built.engine.runner.lease)
    assert built.engine.runner.lease.acquired == 1
    return sink


def test_a_prefill_turn_that_handed_a_first_token_over_keeps_the_cores_one_more_step(tiny_model_dir, tmp_path):
    # The hand-off runs on the decode worker's engine thread, which takes
    # commands only between its steps or while it waits for the cores: had
    # the turn ended with the hand-over, the light request's first token
    # would wait out the decode worker's next step (a round of the flood's rows).
    built = _prefill_worker_engine(tiny_model_dir, tmp_path)
    sink = hand_over_light_beside_a_flood(built)
    assert {"light", "heavy8"} <= set(sink.outputs)  # the next step ran in the same turn
    assert_handed_over_clean(built, sink)


def test_a_turn_keeps_no_extra_step_for_a_hand_over_that_a_slice_followed(tiny_model_dir, tmp_path):
    # A slice runs after the step's other passes have emitted (Engine.step):
    # the hand-off already went through beside it.
    built, sink = _prefill_worker_engine(tiny_model_dir, tmp_path), Collector()
    heavy, light = prompts(2, length=450)
    submit(built, sink, "heavy", heavy, tenant="heavy", max_tokens=2)
    submit(built, sink, "light", light[:20], tenant="light", max_tokens=2)
    built.engine._take_commands(block=False)
    built.engine._step_in_turn(built.engine.runner.lease)
    assert "light" in sink.outputs and built.engine.stats.slices == 1  # one slice: no step after it
    assert_handed_over_clean(built, sink)
