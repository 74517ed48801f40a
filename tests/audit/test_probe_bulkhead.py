"""`bulkhead probe` against the real bulkhead server with the real default model."""

from __future__ import annotations

import json

import pytest

from bulkhead.cli import main
from tests.server_process import ServerProcess
from tests.conftest import write_keys_file

PROBE_ARGS = ["--json", "--concurrency", "4", "--max-tokens", "16", "--skip-coherence", "--timeout", "120"]


def start(tmp_path, scrub_mode: str, env: dict | None = None) -> tuple[ServerProcess, object]:
    keys = write_keys_file(tmp_path)
    proc = ServerProcess(
        ["--role", "colocated", "--api-keys", str(keys), "--kv-memory", "256MiB", "--context-length", "1024",
         "--scrub-mode", scrub_mode],
        tmp_path / "server.log", env=env,
    ).wait_ready()
    return proc, keys


@pytest.mark.e2e
def test_probe_finds_nothing_on_bulkhead(tmp_path, capsys):
    proc, keys = start(tmp_path, "poison")
    try:
        code = main(["probe", proc.url, "--keys", str(keys), *PROBE_ARGS])
        report = json.loads(capsys.readouterr().out)
        assert report["cross_tenant_hits"] == 0, report
        assert report["context_length"] == 1024
        checks = {c["check"]: c for c in report["checks"]}
        assert checks["over_length"]["status"] == "ok" and checks["over_length"]["sent"] == 3, report
        assert checks["differential"]["status"] == "ok", report
        assert checks["aborts"]["status"] == "ok", report
        assert checks["structured"]["status"] == "ok", report  # response_format and forced tool calls served
        assert report["findings"] == [] and code == 0, report
        assert proc.metric("bulkhead_engine_failures_total") == 0
    finally:
        proc.stop()


@pytest.mark.e2e
def test_probe_reports_the_incident_when_bulkhead_runs_the_legacy_admission_path(tmp_path, capsys):
    # A probe that cannot fail proves nothing: re-enable the incident's bug
    # (over-length requests kept alive as stubs that attend over pages nobody
    # wrote for them, freed pages not scrubbed) and the probe must say so.
    faults = tmp_path / "faults"
    faults.write_text("legacy_admission\nno_scrub\n")
    proc, keys = start(tmp_path, "zero", env={"BULKHEAD_FAULTS_FILE": str(faults)})
    try:
        code = main(["probe", proc.url, "--keys", str(keys), *PROBE_ARGS])
        report = json.loads(capsys.readouterr().out)
        assert code == 1, report
        checks = {c["check"]: c for c in report["checks"]}
        assert checks["over_length"]["status"] != "ok", report  # over-length requests were served, not refused
        assert any(f["check"] == "over_length" for f in report["findings"]), report
        fired = proc.info()["harness_counters"]  # the injectors really fired
        assert fired["fault_legacy_admission"] >= 2 and fired["fault_no_scrub"] >= 1, fired
    finally:
        proc.stop()
