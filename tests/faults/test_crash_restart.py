"""A worker dies (kill -9, or os._exit at a chosen protocol state) while it
serves a request, and a replacement is started with the same command line.
The request ends with a typed 503 worker_lost; decode frees a grant whose
writer died only after its lease; the replacement registers and serves."""

import json
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.disagg.cluster_tools import arm, counters, disarm, fresh_counters, wait_for
from tests.faults.checks import LONG_PROMPT, assert_recovered, greedy


def _in_background(fn, *args):
    return ThreadPoolExecutor(max_workers=1).submit(fn, *args)


def _expect_worker_lost(future) -> None:
    """(a): the request running when its worker died ends with a typed 503."""
    with pytest.raises(openai.APIStatusError) as e:
        future.result(timeout=120)
    assert (e.value.status_code, e.value.body.get("code")) == (503, "worker_lost"), e.value.body


def _prefill_counters(cluster, fresh: bool = False) -> dict[str, dict]:
    return {n: c for n, c in (fresh_counters if fresh else counters)(cluster).items() if n.startswith("prefill")}


def _restarted(cluster, name: str, registrations: int) -> None:
    """The replacement registered with the router (a new incarnation) and heartbeats."""
    wait_for(lambda: cluster.info()["counters"]["registrations"] > registrations, timeout=180,
             what=f"the replacement {name} registered")
    cluster.wait_registered()


def test_kill_9_prefill_mid_transfer_then_restart(cluster):
    fired = {n: c.get("fault_stall_transfer", 0) for n, c in _prefill_counters(cluster, fresh=True).items()}
    registrations = cluster.info()["counters"]["registrations"]
    arm(cluster, "stall_transfer")  # holds the write until we act
    call = _in_background(greedy, cluster, LONG_PROMPT)
    victim = wait_for(lambda: next((n for n, c in _prefill_counters(cluster).items()
                                    if c.get("fault_stall_transfer", 0) > fired.get(n, 0)), None),
                      what="a prefill worker in its transfer")
    cluster.kill_worker(victim)
    assert cluster.workers[victim].returncode == -signal.SIGKILL  # (d) it died mid-transfer
    disarm(cluster)
    cluster.start_worker(victim)
    _expect_worker_lost(call)
    _restarted(cluster, victim, registrations)
    assert_recovered(cluster)


def test_kill_9_decode_mid_decode_then_restart(cluster):
    registrations = cluster.info()["counters"]["registrations"]
    body = {"model": "SmolLM2-135M-Instruct", "prompt": "Write a very long essay about rivers.", "max_tokens": 470,
            "temperature": 0, "stream": True, "ignore_eos": True}
    events, victim = [], None
    with httpx.stream("POST", cluster.url + "/v1/completions", json=body, timeout=60,
                      headers={"Authorization": "Bearer sk-alpha-test"}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            events.append(json.loads(line[6:]))
            if victim is None:  # decoding now: find the decode worker that holds its pages
                victim = wait_for(lambda: next((w["name"] for w in cluster.info()["workers"]
                                                if w["role"] == "decode" and w["owned_pages"]), None),
                                  what="a decode worker holding the request")
                killed = cluster.workers[victim]
                cluster.kill_worker(victim)
                cluster.start_worker(victim)
    assert killed.returncode == -signal.SIGKILL  # (d) it died while decoding
    assert "error" in events[-1] and events[-1]["error"]["code"] == "worker_lost", events[-1]  # (a)
    assert not any(e.get("choices") and e["choices"][0].get("finish_reason") for e in events)
    _restarted(cluster, victim, registrations)
    assert_recovered(cluster)


@pytest.mark.parametrize("fault,role", [("crash_after_grant", "prefill"), ("crash_before_manifest", "prefill"),
                                        ("crash_before_commit", "decode")])
def test_worker_crash_at_a_protocol_state_then_restart(cluster, fault, role):
    crashes = len(cluster.crashed())
    registrations = cluster.info()["counters"]["registrations"]
    arm(cluster, fault)
    call = _in_background(greedy, cluster, LONG_PROMPT)
    wait_for(lambda: len(cluster.crashed()) > crashes, what=f"{fault} fired")
    disarm(cluster)  # before the replacement starts: it must not crash too
    assert cluster.crashed()[-1] == fault  # (d), written by the worker just before os._exit
    victim = cluster.exited_worker()
    assert victim.startswith(role)
    cluster.start_worker(victim)
    _expect_worker_lost(call)
    _restarted(cluster, victim, registrations)
    assert_recovered(cluster)
