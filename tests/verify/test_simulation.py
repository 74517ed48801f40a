"""The deterministic simulation of the running system (bulkhead/sim).

The seed count defaults to 1,000 (about 55 s of CPU on this machine's class);
BULKHEAD_SIM_SEEDS changes it, `bulkhead sim --seeds N` runs more.
"""

import os
import subprocess
import sys

import pytest

from bulkhead.sim.faults import FAULT_KINDS
from bulkhead.sim.runner import quiet_runtime_logs, run_seed, run_seeds

SEEDS = int(os.environ.get("BULKHEAD_SIM_SEEDS", "1000"))


def test_every_seed_keeps_every_invariant_and_every_fault_kind_fires():
    summary = run_seeds(range(SEEDS))
    failing = [(r.seed, str(r.violations[0])) for r in summary.failing[:5]]
    assert not summary.violations, f"violations {dict(summary.violations)}; first: {failing}"
    assert not summary.never_fired, f"fault kinds that never fired: {summary.never_fired}"
    assert summary.ok
    # The workload really exercised the paths: answers, rejections and failures all happened.
    for outcome in ("success", "rejected", "error", "aborted"):
        assert summary.stats[f"outcome_{outcome}"] > 0, outcome
    assert summary.stats["pass_slices"] > 0  # prefill passes ran in slices, other steps between them


def test_a_run_in_which_a_fault_kind_never_fired_fails():
    summary = run_seeds(range(1))  # one seed cannot fire all eight kinds
    assert set(summary.never_fired) <= set(FAULT_KINDS) and summary.never_fired
    assert not summary.ok


@pytest.fixture(scope="module")
def ablation_seed():
    """The first seed at which the simulator, with decode's write guard not
    asked (a simulator-only switch), finds a write landing on a moved page."""
    with quiet_runtime_logs():
        for seed in range(200):
            result = run_seed(seed, honour_write_guard=False)
            if any(v.kind == "write_on_moved_page" for v in result.violations):
                return seed
    pytest.fail("no seed in 200 found a violation with the write guard removed")


def test_without_the_write_guard_the_simulator_finds_a_violation_the_guard_prevents(ablation_seed):
    with quiet_runtime_logs():
        guarded = run_seed(ablation_seed)
        unguarded = run_seed(ablation_seed, honour_write_guard=False)
    assert {v.kind for v in unguarded.violations} & {"write_on_moved_page", "foreign_read", "free_page_dirty"}
    assert not guarded.violations
    assert guarded.fired["slow_writer"] + guarded.fired["stale_handle"] > 0  # the guard refused the late write


def test_a_failing_seed_replays_identically(ablation_seed):
    with quiet_runtime_logs():
        first = run_seed(ablation_seed, honour_write_guard=False, trace=True)
        second = run_seed(ablation_seed, honour_write_guard=False, trace=True)
    assert first.violations and [str(v) for v in first.violations] == [str(v) for v in second.violations]
    assert first.trace == second.trace
    assert any("VIOLATION" in line for line in first.trace)


def test_the_cli_replays_a_seed_the_same_in_another_process(ablation_seed):
    # String hashing differs between processes; the trace must not.
    outputs = []
    for hash_seed in ("1", "2"):
        proc = subprocess.run(
            [sys.executable, "-m", "bulkhead.cli", "sim", "--seed", str(ablation_seed), "--no-write-guard"],
            capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": hash_seed}, timeout=300)
        assert proc.returncode == 1, proc.stderr[-2000:]  # violations found: exit status 1
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1]
    assert "VIOLATION write_on_moved_page" in outputs[0]


def test_the_canary_model_reports_a_read_of_another_requests_kv():
    # The detector behind foreign_read, shown on its own: overwrite one of
    # r0's pages with r1's KV between two decode steps.
    from bulkhead.engine.admission import Admitted
    from bulkhead.engine.request import SamplingParams
    from bulkhead.sim.engines import SimGeometry, build_sim_engine

    bad = []
    engine = build_sim_engine(SimGeometry(), 10, "decode-x", bad.append, prefill_only=False).engine
    for i, rid in enumerate(("r0", "r1")):
        engine.submit(Admitted(rid, "alpha", (100 + i,) * 6, SamplingParams(max_tokens=4, temperature=0.0), 40),
                      lambda out: None)
    for _ in range(10):  # both prompts prefilled, one decode step (however the steps are planned)
        engine.run_once()
        if engine.stats.decode_tokens >= 2:
            break
    assert not bad
    p0, p1 = engine.ledger.pages_of("r0")[0], engine.ledger.pages_of("r1")[0]
    engine.pool.data[p0] = engine.pool.data[p1]
    engine.run_once()
    assert bad and bad[0][:2] == ("decode-x", 100) and bad[0][3] == 101.0  # r0 read r1's canary


def test_the_running_workers_take_their_decisions_through_the_checked_transition_functions():
    # The simulator runs the real router and worker classes: what they
    # decide shows up as calls of bulkhead.protocol.*_job, the functions the
    # model checker explores (tests/verify/test_real_protocol.py covers them).
    from bulkhead.protocol import transitions

    transitions.calls.clear()
    with quiet_runtime_logs():
        run_seeds(range(50))
    taken = transitions.explored()
    for step in [("router.submit", "admitted"), ("router.decide", "finalized"), ("prefill.assign", "new"),
                 ("prefill.start_transfer", "post"), ("prefill.quiesced", "acked"), ("decode.assign", "new"),
                 ("decode.pages_reserved", "granted"), ("decode.verdict", "commit"), ("decode.verdict", "failed"),
                 ("decode.drain_ack", "released"), ("decode.finalize", "draining"), ("decode.finished", "finished")]:
        assert step in taken, step
