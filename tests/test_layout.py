"""Imports point one way (STYLE.md): the launcher knows every component, a
component never imports its launcher or a peer's internals, and a process
that computes nothing loads no torch."""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "bulkhead"
LAUNCHERS = {"server/launch.py", "cli.py"}  # they wire components together, so they may know all of them


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def importers_of(prefix: str, package: str) -> list[str]:
    found = []
    for path in sorted((PACKAGE / package).rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel in LAUNCHERS:
            continue
        if any(m == prefix or m.startswith(prefix + ".") for m in imported_modules(path)):
            found.append(rel)
    return found


def test_server_and_disagg_do_not_import_each_other():
    """Both import bulkhead.serving (the Backend contract, engine_info)."""
    assert importers_of("bulkhead.server", "disagg") == []
    assert importers_of("bulkhead.disagg", "server") == []


def test_protocol_imports_no_runtime_package():
    for runtime in ("bulkhead.disagg", "bulkhead.engine", "bulkhead.kv", "bulkhead.model", "bulkhead.server",
                    "bulkhead.serving", "bulkhead.sim", "bulkhead.seams"):
        assert importers_of(runtime, "protocol") == [], runtime


def test_protocol_imports_nothing_from_the_model_checker():
    """The checker builds on the protocol, never the other way round: the
    runtime that imports the protocol must not carry the checker's actors."""
    assert importers_of("bulkhead.verify", "protocol") == []


def test_only_the_model_checker_and_the_cli_import_it():
    users = [rel for rel in importers_of("bulkhead.verify", ".") if not rel.startswith("verify/")]
    assert users == [], users


def modules_loaded_by(module: str) -> set[str]:
    code = f"import sys, json; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(json.loads(out.stdout))


def test_backend_contract_loads_no_torch():
    assert "torch" not in modules_loaded_by("bulkhead.serving.backend")


def test_router_loads_no_torch():
    """The router computes nothing: its backend, the wire format and the
    outputs it relays are plain data (bulkhead.engine.outputs)."""
    loaded = modules_loaded_by("bulkhead.disagg.router")
    assert "torch" not in loaded and "numpy" not in loaded


def test_http_layer_loads_no_torch():
    """The HTTP app serves from a Backend; only the colocated backend holds an engine."""
    assert "torch" not in modules_loaded_by("bulkhead.server.app")


PROTOCOL_MODULES = sorted(f"bulkhead.protocol.{p.stem}" for p in (PACKAGE / "protocol").glob("*.py")
                          if p.stem != "__init__")


def test_every_protocol_module_is_checked_below():
    """The runtime's share of the protocol: a module added to it is covered
    by the next test without being listed there."""
    assert {"bulkhead.protocol.ticket", "bulkhead.protocol.messages", "bulkhead.protocol.manifest",
            "bulkhead.protocol.lifecycle", "bulkhead.protocol.transitions", "bulkhead.protocol.router_job",
            "bulkhead.protocol.prefill_job", "bulkhead.protocol.decode_job"} <= set(PROTOCOL_MODULES)


@pytest.mark.parametrize("module", PROTOCOL_MODULES)
def test_a_protocol_module_loads_no_part_of_the_model_checker(module):
    """A worker that imports the ticket (or any module the runtime shares
    with the checker) runs none of the checker's actors at import."""
    loaded = modules_loaded_by(module)
    assert module in loaded
    assert sorted(m for m in loaded if m == "bulkhead.verify" or m.startswith("bulkhead.verify.")) == []
