"""`bulkhead probe` against the real bulkhead server with the real default model."""

from __future__ import annotations

import json

import pytest

from bulkhead.audit.cli import main
from bulkhead.server.process import ServerProcess

KEYS = {"sk-probe-alpha": "alpha", "sk-probe-beta": "beta"}


@pytest.mark.e2e
def test_probe_finds_nothing_on_bulkhead(tmp_path, capsys):
    keys = tmp_path / "keys.toml"
    keys.write_text("[keys]\n" + "".join(f'"{k}" = "{t}"\n' for k, t in KEYS.items()))
    proc = ServerProcess(
        ["--role", "colocated", "--api-keys", str(keys), "--kv-memory", "256MiB", "--context-length", "1024",
         "--scrub-mode", "poison"],
        tmp_path / "server.log",
    ).wait_ready()
    try:
        code = main(["probe", proc.url, "--keys", str(keys), "--json", "--concurrency", "4", "--max-tokens", "16",
                     "--skip-coherence", "--timeout", "120"])
        report = json.loads(capsys.readouterr().out)
        assert report["cross_tenant_hits"] == 0, report
        assert report["context_length"] == 1024
        checks = {c["check"]: c for c in report["checks"]}
        assert checks["over_length"]["status"] == "ok" and checks["over_length"]["sent"] == 3, report
        assert checks["differential"]["status"] == "ok", report
        assert checks["aborts"]["status"] == "ok", report
        assert report["findings"] == [] and code == 0, report
        assert proc.metric("bulkhead_engine_failures_total") == 0
    finally:
        proc.stop()
