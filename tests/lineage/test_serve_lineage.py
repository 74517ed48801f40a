"""`bulkhead serve --lineage-log` end to end (colocated, the real model, two
tenants), and /ready when the log cannot be written."""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import pytest

from bulkhead.cli import main
from bulkhead.lineage.writer import LineageLog
from bulkhead.server.local_backend import LocalBackend
from tests.conftest import TEST_KEYS, openai_client, write_keys_file
from tests.server_process import ServerProcess


@pytest.mark.e2e
def test_a_colocated_server_writes_a_log_that_verifies_and_names_no_cross_tenant_read(tmp_path, capsys):
    log, key = tmp_path / "lineage.jsonl", tmp_path / "lineage.key"
    proc = ServerProcess(["--role", "colocated", "--api-keys", str(write_keys_file(tmp_path)), "--kv-memory",
                          "64MiB", "--context-length", "512", "--scrub-mode", "poison", "--lineage-log", str(log),
                          "--lineage-key", str(key)], tmp_path / "server.log").wait_ready()
    ids = {}
    try:
        for round_ in range(2):
            for api_key, tenant in TEST_KEYS.items():
                out = openai_client(proc.url, api_key).completions.create(
                    model="SmolLM2-135M-Instruct", prompt=f"{tenant} secret {round_}: the canary is", max_tokens=8,
                    temperature=0)
                ids.setdefault(tenant, []).append(out.id)
        named = openai_client(proc.url, "sk-beta-test").completions.create(
            model="SmolLM2-135M-Instruct", prompt="a named request", max_tokens=4, temperature=0,
            extra_headers={"X-Request-Id": "order-7"})
        assert named.id == "order-7"  # the client's id is all it sees
        assert httpx.get(proc.url + "/health").json() == {"status": "ok"}
        assert httpx.get(proc.url + "/ready").json() == {"status": "ready"}
        assert proc.metric("bulkhead_lineage_ok") == 1
        assert proc.info()["lineage"]["error"] is None
    finally:
        proc.stop()
    args = ["--key", str(key), str(log)]
    assert main(["lineage", "verify", *args]) == 0
    assert "OK" in capsys.readouterr().out
    for tenant in TEST_KEYS.values():
        assert main(["lineage", "who-read", "--tenant", tenant, "--json", *args]) == 0
        assert json.loads(capsys.readouterr().out) == []  # pages reached the other tenant only scrubbed
    assert main(["lineage", "who-read", "--tenant", "alpha", "--include-scrubbed", "--json", *args]) == 0
    assert any(r["tenant"] == "beta" and r["scrubbed"] for r in json.loads(capsys.readouterr().out))
    assert main(["lineage", "request", ids["beta"][1], "--json", *args]) == 0
    story = json.loads(capsys.readouterr().out)
    assert story["tenant"] == "beta" and story["pages"]
    kinds = [r["kind"] for r in story["records"]]
    assert kinds[0] == "alloc" and kinds[-2:] == ["free", "end"]  # the engine frees, then records the end
    assert main(["lineage", "request", "order-7", "--json", *args]) == 0  # by the caller's X-Request-Id
    story = json.loads(capsys.readouterr().out)
    assert (story["tenant"], story["client_id"]) == ("beta", "order-7") and story["pages"]
    assert [r["kind"] for r in story["records"]][0] == "name"


class _NoMetrics:
    def collect(self):
        return iter(())


class DegradedBackend(LocalBackend):
    """Only what /ready reads: a backend over a lineage log and nothing else."""

    def __init__(self, lineage):
        self.built = SimpleNamespace(engine=SimpleNamespace(lineage=lineage))
        self.model_id, self.tokenizer = "none", None

    def collector(self):
        return _NoMetrics()

    def set_tenant_shares(self, weight, kv_share) -> None:
        pass


def test_ready_is_503_while_the_log_cannot_be_written_and_health_stays_200(tmp_path, monkeypatch):
    import os

    from fastapi.testclient import TestClient

    from bulkhead.server.app import ServerState, create_app

    lineage = LineageLog(tmp_path / "l.jsonl", bytes(32), flush_interval_s=3600)
    client = TestClient(create_app(ServerState(DegradedBackend(lineage), None)))
    assert client.get("/ready").json() == {"status": "ready"}
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    lineage.allocated("r", "alpha", [0], [1])
    lineage.flush()
    response = client.get("/ready")
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "not_ready" and error["type"] == "server_error"
    assert "l.jsonl cannot be written" in error["message"] and "No space left" in error["reasons"][0]
    assert "alpha" not in response.text  # open without a key: names no tenant
    # Liveness: the process answers; restarting it would lose the records it still holds.
    assert client.get("/health").status_code == 200
    monkeypatch.setattr(os, "write", real_write)
    lineage.flush()  # written again: ready again, nothing lost
    assert client.get("/ready").status_code == 200 and lineage.records_lost == 0
    lineage.close()

