"""The protocol package is pure: importing it loads no torch, no transport
and no threads, so the checker, the simulator and a unit test can hold it
without a model or a socket."""
import json
import subprocess
import sys

FORBIDDEN = ("torch", "numpy", "zmq", "socket", "threading", "asyncio", "bulkhead.disagg",
             "bulkhead.engine", "bulkhead.kv", "bulkhead.server")


def loaded_after_import(module: str) -> set[str]:
    code = f"import sys, json; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(json.loads(out.stdout))


def test_protocol_package_imports_nothing_impure():
    loaded = loaded_after_import("bulkhead.protocol")
    assert "bulkhead.protocol.decode" in loaded  # the package loads its parts
    bad = sorted(m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert bad == []


def test_model_checker_imports_only_the_pure_protocol():
    """`bulkhead verify` explores the protocol package alone (its `sim`
    subcommand loads the runtime on demand, not at import)."""
    loaded = loaded_after_import("bulkhead.verify.cli")
    bad = sorted(m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert bad == []
