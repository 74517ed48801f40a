"""The protocol package is pure: importing it loads no torch, no transport
and no threads, so the checker, the simulator and a unit test can hold it
without a model or a socket."""
import json
import subprocess
import sys
from pathlib import Path

FORBIDDEN = ("torch", "numpy", "zmq", "socket", "threading", "asyncio", "bulkhead.disagg",
             "bulkhead.engine", "bulkhead.kv", "bulkhead.server")


def loaded_after_import(module: str) -> set[str]:
    code = f"import sys, json; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(json.loads(out.stdout))


PACKAGE = Path(__file__).resolve().parents[2] / "bulkhead"
# The package re-exports nothing (importers name the module), so import each part.
PARTS = sorted(".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)
               for folder in ("protocol", "verify/actors") for p in (PACKAGE / folder).glob("*.py")
               if p.stem != "__init__")


def test_protocol_package_imports_nothing_impure():
    """The shared protocol and the checker's actors over it."""
    loaded = loaded_after_import(", ".join(PARTS))
    assert {"bulkhead.protocol.ticket", "bulkhead.verify.actors.decode"} <= loaded
    bad = sorted(m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert bad == []


def test_model_checker_imports_only_the_pure_protocol():
    """`bulkhead verify` explores the protocol package alone (its `sim`
    subcommand loads the runtime on demand, not at import)."""
    loaded = loaded_after_import("bulkhead.verify.cli")
    bad = sorted(m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert bad == []
