"""Adapters through a drain, a rolling restart and a keys.toml reload, in the
default deployment (a router, one prefill and one decode worker, each its
own process as on separate hosts, through the fault harness) over a tiny
model, with the adapters registered in keys.toml.

- A request on an adapter held by a worker when that worker is drained
  finishes on its adapter with the answer it gets alone.
- After every worker was restarted (SIGTERM: drain, exit; a fresh process
  takes its name), adapters serve again: the fresh workers load the files on
  first use and check their digest (a swapped file is refused by the fresh
  decode worker), and another tenant naming the adapter still gets the 404
  of a name that exists nowhere.
- A reload of keys.toml that removes an adapter: new requests get 404
  model_not_found, a request in flight on it finishes on it.

Each "in flight" is made certain, not hoped for: the *_until_drain faults
(tests/faults/harness.py) keep the request in the worker's engine queue until
the router's Drain reaches that worker (across the reload, a drain that
comes once the removal is in force).
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bench.lora_adapters import write_adapter
from bulkhead.lora.peft_files import BaseShapes
from bulkhead.model.config import load_model_config
from tests.disagg.cluster_tools import arm, disarm, total, wait_for, wait_workers_idle
from tests.faults.adapter_swap import swap_weights
from tests.faults.fault_cluster import FaultCluster
from tests.server_process import OPERATOR_HEADERS

pytestmark = pytest.mark.e2e
WORKERS = ("prefill-0", "decode-0")
KEYS = {"sk-alpha-test": "alpha", "sk-beta-test": "beta"}
ALPHA, BETA = "sk-alpha-test", "sk-beta-test"
PROMPT = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
# What each worker's engine is held by until its Drain arrives.
UNTIL_DRAIN = {"prefill-0": "stall_prefill_until_drain", "decode-0": "stall_verify_until_drain"}
ADAPTERS = {"alpha": {"sql": ("alpha-sql", 1), "doc": ("alpha-doc", 3), "gone": ("alpha-gone", 5)},
            "beta": {"sql": ("beta-sql", 2)}}
CASES = ((ALPHA, None), (ALPHA, "sql"), (BETA, "sql"), (ALPHA, "doc"))


def _keys_text(dirs: dict, leave_out: tuple[str, ...] = ()) -> str:
    text = "[keys]\n" + "".join(f'"{k}" = "{t}"\n' for k, t in KEYS.items())
    for tenant, names in ADAPTERS.items():
        text += f"\n[tenants.{tenant}.adapters]\n" + "".join(
            f'"{n}" = "{dirs[d]}"\n' for n, (d, _) in names.items() if n not in leave_out)
    return text


def _write_keys(path, text: str) -> None:
    path.write_text(text)
    t = time.time() + 5  # a new mtime even within the file system's timestamp granularity
    os.utime(path, (t, t))


def _post(cluster, key: str, model: str | None = None) -> httpx.Response:
    body = {**PROMPT, **({"model": model} if model else {})}
    return httpx.post(cluster.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=120)


def _text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def _states(cluster) -> dict:
    return {w["name"]: w["state"] for w in cluster.info()["workers"]}


def _all_live(cluster) -> bool:
    return _states(cluster) == {name: "live" for name in WORKERS}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, tiny_model_dir):
    work = tmp_path_factory.mktemp("lora-roll")
    shapes = BaseShapes.of(load_model_config(tiny_model_dir))
    dirs = {d: write_adapter(work / d, shapes, rank=8, alpha=16, seed=seed, scale=0.5)
            for names in ADAPTERS.values() for d, seed in names.values()}
    keys = work / "keys.toml"
    keys.write_text(_keys_text(dirs))
    cluster = FaultCluster(work, keys=keys, model_args=("--model", str(tiny_model_dir)))
    try:
        cluster.start_router()
        for name in WORKERS:
            cluster.start_worker(name)
        cluster.wait_registered(WORKERS, timeout=300)
        reference = {case: _text(_post(cluster, *case)) for case in (*CASES, (ALPHA, "gone"))}
        assert len(set(reference.values())) == len(reference)  # five sets of weights: the comparisons can fail
        with ThreadPoolExecutor(2) as pool:
            yield cluster, reference, dirs, keys, pool
        for w in wait_workers_idle(cluster):
            assert w["engine_failures"] == 0, f"{w['name']}: a step read poisoned KV"
    finally:
        cluster.stop()


def _held_until_drain(cluster, pool, worker: str, case):
    """Send `case` with `worker`'s engine held until its Drain; returns the
    response's future once the request waits there."""
    fault, role = UNTIL_DRAIN[worker], worker.split("-")[0]
    before = total(cluster, f"fault_{fault}", role, fresh=True)
    arm(cluster, fault)
    future = pool.submit(_post, cluster, *case)
    try:
        wait_for(lambda: total(cluster, f"fault_{fault}", role) > before, what=f"{fault} fired in {worker}")
    finally:
        disarm(cluster)
    return future


def _drain(cluster, worker: str) -> httpx.Response:
    return httpx.post(f"{cluster.url}/admin/workers/{worker}/drain", json={"force": True},
                      headers=OPERATOR_HEADERS, timeout=30)


def _resume(cluster, worker: str) -> None:
    httpx.post(f"{cluster.url}/admin/workers/{worker}/resume", headers=OPERATOR_HEADERS, timeout=30)
    wait_for(lambda: _all_live(cluster), timeout=30, what=f"{worker} live again")


@pytest.mark.parametrize("worker", WORKERS)
def test_an_adapter_request_held_by_a_worker_being_drained_finishes_on_its_adapter(deployment, worker):
    cluster, reference, _, _, pool = deployment
    future = _held_until_drain(cluster, pool, worker, (ALPHA, "sql"))
    drained = _drain(cluster, worker)
    try:
        assert drained.status_code == 200, drained.text
        r = future.result(timeout=120)
        assert r.json()["model"] == "sql"
        assert _text(r) == reference[(ALPHA, "sql")]  # its own adapter's answer, as alone
        wait_for(lambda: _states(cluster)[worker] == "drained", timeout=30, what=f"{worker} drained")
    finally:
        _resume(cluster, worker)


def test_after_a_rolling_restart_adapters_serve_again_and_stay_private(deployment):
    cluster, reference, dirs, _, pool = deployment
    for worker in WORKERS:
        future = _held_until_drain(cluster, pool, worker, (ALPHA, "doc"))
        cluster.workers[worker].send_signal(signal.SIGTERM)  # drain, then exit
        assert _text(future.result(timeout=120)) == reference[(ALPHA, "doc")]
        assert cluster.workers[worker].wait(timeout=90) == 0  # it left on its own, drained
        cluster.start_worker(worker)
        wait_for(lambda: _all_live(cluster), timeout=180, what=f"{worker}'s replacement registered")
    # The fresh decode worker holds no adapter: it loads the files on first use and checks
    # their digest. Changed after prefill computed the prompt, they are refused.
    weights = dirs["alpha-sql"] / "adapter_model.safetensors"
    original = weights.read_bytes()
    fired = total(cluster, "fault_swap_adapter", "decode", fresh=True)
    arm(cluster, "swap_adapter")
    try:
        refused = _post(cluster, ALPHA, "sql")
    finally:
        disarm(cluster)
        weights.write_bytes(original)
    wait_for(lambda: total(cluster, "fault_swap_adapter", "decode") > fired, what="swap_adapter fired in decode")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "adapter_unavailable", refused.text
    wait_workers_idle(cluster)  # the refused request's pages went back, scrubbed
    for case in CASES:
        assert _text(_post(cluster, *case)) == reference[case], case
    other, nowhere = _post(cluster, BETA, "doc"), _post(cluster, BETA, "nowhere")
    assert other.status_code == nowhere.status_code == 404
    assert other.json()["error"]["code"] == "model_not_found"
    assert other.text.replace("doc", "X") == nowhere.text.replace("nowhere", "X")


def _models(cluster, key: str) -> set[str]:
    r = httpx.get(cluster.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    return {m["id"] for m in r.json()["data"]}


def test_a_reload_that_removes_an_adapter_refuses_new_requests_and_finishes_those_in_flight(deployment):
    cluster, reference, dirs, keys, pool = deployment
    # Held by decode until its Drain, which comes only once the removal was seen in force.
    in_flight = _held_until_drain(cluster, pool, "decode-0", (ALPHA, "gone"))
    try:
        _write_keys(keys, _keys_text(dirs, leave_out=("gone",)))
        wait_for(lambda: "gone" not in _models(cluster, ALPHA), what="the reload in force")
        refused = _post(cluster, ALPHA, "gone")  # the router's own refusal: no engine involved
        assert not in_flight.done()
    finally:
        _drain(cluster, "decode-0")  # lets the held request go on
        try:
            r = in_flight.result(timeout=120)
        finally:
            _resume(cluster, "decode-0")
            _write_keys(keys, _keys_text(dirs))
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found", refused.text
    assert r.json()["model"] == "gone" and _text(r) == reference[(ALPHA, "gone")]
    assert "sql" in _models(cluster, ALPHA)  # only the removed one went
    wait_for(lambda: "gone" in _models(cluster, ALPHA), what="the restored file in force")
    assert _text(_post(cluster, ALPHA, "gone")) == reference[(ALPHA, "gone")]
