"""End to end through router -> prefill -> KV transfer -> decode, real processes."""

import glob
import json
import os
import signal
import threading
import time
import uuid

import httpx
import openai
import pytest

from tests.disagg.cluster_tools import arm, counters, disarm, fresh_counters, pid_of, total, wait_for, wait_workers_idle
from tests.disagg.conftest import DECODE_POOL_TOKENS, PREFILL_POOL_TOKENS, SMOLLM2_KV
from tests.server_process import OPERATOR_KEY

MODEL = "SmolLM2-135M-Instruct"
pytestmark = pytest.mark.e2e


def test_the_router_advertises_the_smallest_worker_limit(cluster):
    info = cluster.info()
    assert info["role"] == "router"
    assert info["context_length"] == PREFILL_POOL_TOKENS  # prefill clamped to its pool
    workers = {w["name"]: w for w in info["workers"]}
    assert workers["decode-0"]["context_length"] == DECODE_POOL_TOKENS
    assert all(w["context_length_clamped"] for w in workers.values())
    assert info["worker_limits_differ"] is True


def test_server_info_reports_each_process_resident_memory_and_pool(cluster):
    memory = cluster.info()["memory"]
    names = {"router", "prefill-0", "prefill-1", "decode-0", "decode-1"}
    assert set(memory["rss_bytes"]) == names and all(n > 0 for n in memory["rss_bytes"].values())
    assert set(memory["kv_pool_bytes"]) == names - {"router"}
    assert memory["kv_pool_bytes"]["decode-0"] == DECODE_POOL_TOKENS * SMOLLM2_KV.bytes_per_token
    assert memory["rss_beyond_kv_pools_bytes"] == sum(memory["rss_bytes"].values()) - sum(
        memory["kv_pool_bytes"].values())


def test_preflight_flags_the_clamped_workers_of_the_live_cluster(cluster, capsys):
    # Deliberately misconfigured like the incident (pools clamped below the
    # model's context, prefill's smaller than decode's): preflight must say so.
    from bulkhead.cli import main

    code = main(["preflight", cluster.url, "--api-key", OPERATOR_KEY, "--json"])  # /server_info is an operator's
    report = json.loads(capsys.readouterr().out)
    assert code == 1, report
    assert report["findings"]


def test_disaggregated_greedy_answer_equals_the_colocated_one(cluster, alpha, smollm2_dir):
    from bulkhead.engine.admission import admit
    from bulkhead.engine.builder import EngineConfig, build_engine
    from bulkhead.engine.request import SamplingParams

    prompts = ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):"]
    built = build_engine(EngineConfig(smollm2_dir, MODEL, 64 * 2**20, context_length=1024))
    reference = {}
    for i, p in enumerate(prompts):
        ids = built.tokenizer.encode(p)
        built.engine.submit(admit(f"r{i}", "t", ids, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True),
                                  built.limits), lambda o, i=i: reference.setdefault(i, []).extend(o.token_ids))
        built.engine.run_until_idle()
    for i, p in enumerate(prompts):
        r = alpha.completions.create(model=MODEL, prompt=p, max_tokens=24, temperature=0, logprobs=0,
                                     extra_body={"ignore_eos": True})
        tokens = built.tokenizer.encode("".join(r.choices[0].logprobs.tokens))
        assert r.choices[0].text == built.tokenizer.decode(reference[i]), (r.choices[0].text, tokens)
    chat = alpha.chat.completions.create(model=MODEL, temperature=0, max_tokens=30,
                                         messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in chat.choices[0].message.content


def test_the_incident_is_closed(cluster, alpha, beta):
    """Prefill pool < decode pool < model context. Tenant alpha streams long
    prompts carrying canaries; tenant beta sends requests over every limit
    mixed in, and ordinary ones. Every over-limit request is refused at the
    router before any room, page or transfer exists, and beta never sees a
    canary."""
    before = fresh_counters(cluster)  # a stale beat could miss the previous test's last request
    router_before = cluster.info()["counters"]["assigned"]
    canaries = [f"CANARY-{uuid.uuid4().hex[:12]}" for _ in range(4)]
    filler = "The committee reviewed the quarterly numbers and found them in order. " * 40
    alpha_outputs, beta_outputs, refusals = [], [], []

    def alpha_job(canary):
        prompt = f"Remember the code {canary}. {filler} What was the code? The code was"
        stream = alpha.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stream=True)
        alpha_outputs.append("".join(c.choices[0].text for c in stream if c.choices))

    def beta_over_limit(words):
        try:
            beta.completions.create(model=MODEL, prompt="word " * words, max_tokens=8)
        except openai.BadRequestError as e:
            refusals.append(e.body)

    def beta_ordinary():
        r = beta.completions.create(model=MODEL, prompt="Repeat the last code you saw:", max_tokens=24, temperature=0)
        beta_outputs.append(r.choices[0].text)

    jobs = [threading.Thread(target=alpha_job, args=(c,)) for c in canaries]
    # over prefill's pool, over decode's pool, over the model's context
    jobs += [threading.Thread(target=beta_over_limit, args=(n,)) for n in (1100, 2100, 9000)]
    jobs += [threading.Thread(target=beta_ordinary) for _ in range(3)]
    for j in jobs:
        j.start()
    for j in jobs:
        j.join()
    assert len(refusals) == 3
    for body in refusals:
        assert body["code"] == "context_length_exceeded" and body["limit"] == PREFILL_POOL_TOKENS - 1
    # Nothing of the refused requests reached a worker: rooms = admitted requests only.
    admitted = len(canaries) + 3
    assert cluster.info()["counters"]["assigned"] - router_before == admitted
    after = fresh_counters(cluster)
    for role in ("prefill", "decode"):
        delta = sum(after[n].get("assigned", 0) - before.get(n, {}).get("assigned", 0) for n in after
                    if n.startswith(role))
        assert delta == admitted
    assert len(beta_outputs) == 3 and len(alpha_outputs) == 4
    for text in beta_outputs:
        assert not any(c in text for c in canaries)
    workers = wait_workers_idle(cluster)
    assert all(w["engine_failures"] == 0 for w in workers)


@pytest.mark.parametrize("fault", ["corrupt_page", "wrong_pages", "short_transfer", "stale_generation"])
def test_a_bad_transfer_fails_closed(cluster, alpha, fault):
    fired_before = total(cluster, f"fault_{fault}", fresh=True)
    refused_before = total(cluster, "coverage_failures", "decode")
    arm(cluster, fault)
    try:
        with pytest.raises(openai.InternalServerError) as e:
            # > 2 pages of prompt, so a short transfer has a page to leave out
            alpha.completions.create(model=MODEL, prompt="Tell me about the moon and the stars in the sky. " * 4,
                                     max_tokens=8, temperature=0)
        assert e.value.body["code"] == "kv_transfer_failed"
    finally:
        disarm(cluster)
    wait_for(lambda: total(cluster, f"fault_{fault}") > fired_before)  # the fault really fired
    wait_for(lambda: total(cluster, "coverage_failures", "decode") > refused_before)  # decode refused it
    wait_workers_idle(cluster)
    r = alpha.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert r.choices[0].text  # and the deployment keeps serving


def test_a_replayed_control_message_is_dropped(cluster, alpha):
    dropped = cluster.info()["control_plane"]["dropped_replay"]
    arm(cluster, "replay_control")
    try:
        r = alpha.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    finally:
        disarm(cluster)
    assert r.choices[0].text
    wait_for(lambda: total(cluster, "fault_replay_control") > 0)
    assert cluster.info()["control_plane"]["dropped_replay"] > dropped
    wait_workers_idle(cluster)


def test_without_a_drain_ack_pages_wait_for_the_lease(cluster, alpha):
    expiries = total(cluster, "lease_expiries", "decode", fresh=True)
    arm(cluster, "corrupt_page", "withhold_drain_ack")
    try:
        with pytest.raises(openai.InternalServerError):
            alpha.completions.create(model=MODEL, prompt="Tell me about the moon and the stars.", max_tokens=8)
    finally:
        disarm(cluster)
    wait_for(lambda: total(cluster, "fault_withhold_drain_ack") > 0)
    wait_for(lambda: total(cluster, "lease_expiries", "decode") > expiries, timeout=20)
    wait_workers_idle(cluster)


def test_client_disconnect_during_the_transfer(cluster):
    arm(cluster, "slow_transfer")
    try:
        body = {"prompt": "A long story begins here.", "max_tokens": 50, "stream": True}
        h = {"Authorization": "Bearer sk-alpha-test"}
        with pytest.raises(httpx.ReadTimeout):
            with httpx.stream("POST", cluster.url + "/v1/completions", json=body, headers=h, timeout=1.0) as r:
                for _ in r.iter_lines():
                    pass
    finally:
        disarm(cluster)
    wait_for(lambda: total(cluster, "fault_slow_transfer") > 0)
    wait_workers_idle(cluster)


def test_kill_9_of_a_prefill_worker_mid_transfer(cluster, alpha):
    arm(cluster, "slow_transfer")
    errors = []

    def call():
        try:
            alpha.completions.create(model=MODEL, prompt="The history of bread is long and", max_tokens=8)
        except openai.APIStatusError as e:
            errors.append(e)

    t = threading.Thread(target=call)
    before = fresh_counters(cluster)
    t.start()
    wait_for(lambda: any(c.get("assigned", 0) > before[n].get("assigned", 0)
                         for n, c in counters(cluster).items() if n.startswith("prefill")))
    victim = next(n for n, c in counters(cluster).items()
                  if n.startswith("prefill") and c.get("assigned", 0) > before[n].get("assigned", 0))
    time.sleep(0.5)  # inside the slow transfer
    os.kill(pid_of(cluster, victim), signal.SIGKILL)
    disarm(cluster)
    t.join(timeout=60)
    assert errors and errors[0].status_code == 503 and errors[0].body["code"] == "worker_lost"
    wait_for(lambda: victim not in counters(cluster))
    wait_workers_idle(cluster)  # decode freed its grant after the lease
    r = alpha.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert r.choices[0].text


def test_kill_9_of_a_decode_worker_mid_decode(cluster, alpha):
    h = {"Authorization": "Bearer sk-alpha-test"}
    body = {"prompt": "Write a very long essay about rivers.", "max_tokens": 400, "stream": True,
            "ignore_eos": True}
    events = []
    with httpx.stream("POST", cluster.url + "/v1/completions", json=body, headers=h, timeout=60) as r:
        killed = False
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            events.append(json.loads(line[6:]))
            if len(events) == 3 and not killed:
                def busy_decodes():  # heartbeats report pages with up to 0.5 s delay
                    return [w["name"] for w in cluster.info()["workers"]
                            if w["name"].startswith("decode") and w["owned_pages"]]

                wait_for(busy_decodes)
                victim = pid_of(cluster, busy_decodes()[0])
                assert glob.glob(f"/dev/shm/bulkhead-kv-{victim}-*")  # its pool, with its tenants' KV
                os.kill(victim, signal.SIGKILL)
                killed = True
    assert killed and "error" in events[-1] and events[-1]["error"]["code"] == "worker_lost"
    wait_for(lambda: not glob.glob(f"/dev/shm/bulkhead-kv-{victim}-*"))  # swept by the router's worker watch
    r = alpha.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert r.choices[0].text  # the surviving pair serves


def test_prefill_prefix_cache_is_tenant_scoped(cluster, alpha, beta):
    prompt = f"Shared preamble {uuid.uuid4().hex}. " + "The rules of the house are simple and clear. " * 6
    hits = lambda: total(cluster, "prefix_cache_hit_pages", "prefill")  # noqa: E731
    first = alpha.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0)
    wait_workers_idle(cluster)
    before = hits()
    beta.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0)
    time.sleep(1.2)  # two heartbeats
    assert hits() == before  # another tenant never hits
    again = alpha.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0)
    wait_for(lambda: hits() > before)  # the same tenant does
    assert again.choices[0].text == first.choices[0].text


def test_the_router_tells_a_fleet_router_its_routes_and_its_fuller_pool(cluster):
    from prometheus_client.parser import text_string_to_metric_families

    from tests.server_process import OPERATOR_HEADERS

    def fleet() -> dict[str, list]:
        text = httpx.get(cluster.url + "/metrics/fleet", headers=OPERATOR_HEADERS, timeout=10).text
        return {f.name: f.samples for f in text_string_to_metric_families(text)}

    body = {"prompt": "A long story begins here.", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", cluster.url + "/v1/completions", json=body,
                      headers={"Authorization": "Bearer sk-alpha-test"}, timeout=120) as r:
        assert r.status_code == 200  # routed: in the route table until it ends
        # The workers do not wait for the client, and their pages reach the
        # router with heartbeats: scrape until the request shows (bounded).
        for _ in range(200):
            during = fleet()
            routed = sum(during[n][0].value for n in ("vllm:num_requests_waiting", "vllm:num_requests_running"))
            if routed == 1 and during["vllm:kv_cache_usage_perc"][0].value > 0:
                break
        else:
            raise AssertionError(f"the router's fleet figures never showed the request: {during}")
    assert during["vllm:kv_cache_usage_perc"][0].value <= 1
    assert not any("tenant" in s.labels or "alpha" in s.labels.values() for f in during.values() for s in f)
    workers = wait_workers_idle(cluster)
    after = fleet()
    assert after["vllm:num_requests_running"][0].value == 0 and after["vllm:kv_cache_usage_perc"][0].value == 0
    (cache,) = after["vllm:cache_config_info"]
    assert cache.labels["num_gpu_blocks"] == str(sum(w["num_pages"] for w in workers if w["role"] == "decode"))
