"""Tenant-private adapters through `bulkhead serve` over a tiny model: each
tenant reaches its own adapters by name and nobody else's, and a reload of
keys.toml adds and removes them."""

import os
import time

import httpx
import pytest

from bulkhead.lora.peft_files import BaseShapes
from bulkhead.model.config import load_model_config
from tests.server_process import OPERATOR_HEADERS, ServerProcess
from bench.lora_adapters import write_adapter

KEYS = {"sk-a": "alpha", "sk-b": "beta", "sk-g": "gamma"}
PROMPT = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}


def _keys_text(adapters: dict[str, dict[str, str]]) -> str:
    text = "[keys]\n" + "".join(f'"{k}" = "{t}"\n' for k, t in KEYS.items())
    for tenant, names in adapters.items():
        text += f"\n[tenants.{tenant}.adapters]\n" + "".join(f'"{n}" = "{p}"\n' for n, p in names.items())
    return text


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    work = tmp_path_factory.mktemp("lora-server")
    shapes = BaseShapes.of(load_model_config(tiny_model_dir))
    dirs = {name: write_adapter(work / name, shapes, rank=8, alpha=16, seed=seed, scale=0.5)
            for name, seed in (("alpha-sql", 1), ("beta-sql", 2))}
    dirs["broken"] = write_adapter(work / "broken", shapes, config={"r": 1000})
    adapters = {"alpha": {"sql": dirs["alpha-sql"]}, "beta": {"sql": dirs["beta-sql"], "broken": dirs["broken"]}}
    keys = work / "keys.toml"
    keys.write_text(_keys_text(adapters))
    proc = ServerProcess(["--role", "colocated", "--model", str(tiny_model_dir), "--api-keys", str(keys),
                          "--scrub-mode", "poison", "--kv-memory", "64MiB", "--prefix-cache", "on"],
                         work / "server.log").wait_ready()
    yield proc, keys, adapters
    try:
        assert proc.metric("bulkhead_engine_failures_total") == 0, proc.log()
        proc.wait_idle()
    finally:
        proc.stop()


def _post(proc, key, **body):
    return httpx.post(proc.url + "/v1/completions", json={**PROMPT, **body},
                      headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _models(proc, key):
    r = httpx.get(proc.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    return [m["id"] for m in r.json()["data"]]


def test_each_tenant_lists_the_base_model_and_its_own_adapters_only(served):
    proc, _, _ = served
    alpha, beta, gamma = _models(proc, "sk-a"), _models(proc, "sk-b"), _models(proc, "sk-g")
    assert alpha[0] == beta[0] == gamma[0] and alpha[0] != "sql"  # the base model first
    assert (alpha[1:], beta[1:], gamma[1:]) == (["sql"], ["sql"], [])  # beta's "broken" was refused at load
    assert "refused" in proc.log() and "broken" in proc.log() and "1000" in proc.log()


def test_an_adapter_changes_the_answer_and_the_response_names_it(served):
    proc, _, _ = served
    base, alpha, beta = _post(proc, "sk-a"), _post(proc, "sk-a", model="sql"), _post(proc, "sk-b", model="sql")
    assert base.status_code == alpha.status_code == beta.status_code == 200, (alpha.text, beta.text)
    assert alpha.json()["model"] == "sql" and base.json()["model"] != "sql"
    texts = {r.json()["choices"][0]["text"] for r in (base, alpha, beta)}
    assert len(texts) == 3  # three sets of weights, three answers
    assert _post(proc, "sk-a", model="sql").json()["choices"][0]["text"] == alpha.json()["choices"][0]["text"]


def test_another_tenants_adapter_is_the_same_404_as_no_adapter_at_all(served):
    proc, _, _ = served
    other, nowhere = _post(proc, "sk-g", model="sql"), _post(proc, "sk-g", model="nowhere")
    assert other.status_code == nowhere.status_code == 404
    assert other.json()["error"]["code"] == "model_not_found"
    assert other.text.replace("sql", "X") == nowhere.text.replace("nowhere", "X")
    assert "alpha" not in other.text and "beta" not in other.text


def test_only_an_operator_sees_the_dashboards_adapters_column(served):
    """The dashboard lists each tenant's adapters (docs/dashboard.md): its figures
    and /server_info answer a tenant's key with the same 403 whatever it
    names, and the open page holds none of them."""
    proc, _, adapters = served
    operator = httpx.get(proc.url + "/dashboard/data", headers=OPERATOR_HEADERS, timeout=10)
    assert operator.status_code == 200, operator.text
    rows = operator.json()["tenants"]
    assert rows["alpha"]["adapters"] == ["sql"] and rows["beta"]["adapters"] == ["sql"]  # what a leak would show
    for path in ("/dashboard/data", "/server_info"):
        for key in ("sk-a", "sk-g"):  # a tenant with adapters, one without
            r = httpx.get(proc.url + path, headers={"Authorization": f"Bearer {key}"}, timeout=10)
            assert r.status_code == 403 and r.json()["error"]["code"] == "permission_denied", r.text
            assert "sql" not in r.text and "beta" not in r.text and "adapters" not in r.text
            assert all(str(d) not in r.text for names in adapters.values() for d in names.values())
    page = httpx.get(proc.url + "/dashboard", timeout=10).text
    assert "sql" not in page and "alpha-sql" not in page


def test_a_reload_adds_and_removes_adapters(served):
    proc, keys, adapters = served
    moved = {"alpha": {"sql2": adapters["alpha"]["sql"]}, "gamma": {"sql": adapters["beta"]["sql"]}}
    try:
        keys.write_text(_keys_text(moved))
        t = time.time() + 5
        os.utime(keys, (t, t))
        deadline = time.monotonic() + 30
        while _post(proc, "sk-g", model="sql").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _post(proc, "sk-g", model="sql").status_code == 200
        assert _post(proc, "sk-a", model="sql").status_code == 404
        assert _post(proc, "sk-a", model="sql2").status_code == 200
    finally:
        keys.write_text(_keys_text(adapters))
        t = time.time() + 10
        os.utime(keys, (t, t))
