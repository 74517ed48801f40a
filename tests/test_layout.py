"""Imports point one way (STYLE.md): the launcher knows every component, a
component imports only the packages below it, and a process that computes
nothing loads no torch."""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "bulkhead"

# bulkhead's packages (and top-level modules), bottom first. Every import,
# lazy or under TYPE_CHECKING alike, points to a lower layer: never up,
# never sideways (server and disagg meet only in serving's contract and the
# launcher). A new package is placed here before it can be imported.
LAYERS = [
    {"errors", "cpu"},                # the typed errors in the OpenAI error shape; the CPU's features
    {"lineage", "protocol"},          # the page-lineage log; the transfer protocol's pure core
    {"kv", "lora"},                   # pages, ledger, prefix cache; tenants' LoRA adapters as files (no torch)
    {"serving"},                      # the torch-free contract between the HTTP layer and a backend
    {"model"},                        # the model and its kernels
    {"engine"},                       # scheduler, runner, sampler: one process's engine
    {"seams"},                        # what a harness may substitute (it extends engine.engine_parts)
    {"server", "disagg"},             # the HTTP API; the router and its workers
    {"sim"},                          # the deterministic simulation of the running system
    {"verify", "admin", "audit"},     # the model checker; operator and capacity tools
    {"launch"},                       # the composition root: wires server, disagg and engine
    {"cli"},                          # the `bulkhead` command
    {"__main__"},                     # `python -m bulkhead`: the same command
]
LAYER_OF = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def imported_modules(path: Path) -> set[str]:
    """Every bulkhead module a file imports, absolute (relative ones resolved)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = path.parent.parts[path.parts.index("bulkhead"):]
                base = base[:len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)  # `from bulkhead import seams`
    return names


def unit_of(module: str, root: Path) -> str | None:
    """The top-level package or module of bulkhead that `module` names; None
    for bulkhead itself (its __init__ holds the version, below everything)."""
    parts = module.split(".")
    if parts[0] != "bulkhead" or len(parts) < 2:
        return None
    unit = parts[1]
    return unit if (root / unit).is_dir() or (root / f"{unit}.py").exists() else None


def units(root: Path) -> set[str]:
    return {p.stem for p in root.iterdir() if (p.suffix == ".py" and p.stem != "__init__")
            or (p.is_dir() and (p / "__init__.py").exists())}


def imports_against_the_order(root: Path) -> list[str]:
    """Each file's imports that point up or sideways, as 'file imports unit (layer -> layer)'."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        own = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if own == "__init__":
            continue
        targets = {unit_of(module, root) for module in imported_modules(path)} - {None, own}
        found += [f"{rel} imports {t} (layer {LAYER_OF[own]} -> {LAYER_OF[t]})"
                  for t in sorted(targets) if LAYER_OF[t] >= LAYER_OF[own]]
    return found


def test_every_package_has_a_place_in_the_order():
    assert units(PACKAGE) == set(LAYER_OF)


def test_every_import_points_down_the_order():
    assert imports_against_the_order(PACKAGE) == []


def test_the_order_check_catches_an_upward_and_a_sideways_import(tmp_path):
    """The check itself: a lazy upward import (engine reaching for disagg,
    as seams.py once did) and a sideways one (server importing disagg, as
    the launcher once did from server/) are both reported."""
    root = tmp_path / "bulkhead"
    for unit in LAYER_OF:
        (root / unit).mkdir(parents=True)
        (root / unit / "__init__.py").write_text("")
    (root / "engine" / "builder.py").write_text("def f():\n    from bulkhead.disagg.zmq_links import WorkerLink\n")
    (root / "server" / "launch.py").write_text("from bulkhead import disagg\n")
    (root / "launch" / "serve.py").write_text("import bulkhead.server.app\nfrom bulkhead.engine import builder\n")
    assert imports_against_the_order(root) == [
        "engine/builder.py imports disagg (layer 5 -> 7)",
        "server/launch.py imports disagg (layer 7 -> 7)",
    ]


def importers_of(prefix: str, package: str) -> list[str]:
    found = []
    for path in sorted((PACKAGE / package).rglob("*.py")):
        if any(m == prefix or m.startswith(prefix + ".") for m in imported_modules(path)):
            found.append(str(path.relative_to(PACKAGE)))
    return found


def test_only_the_model_checker_and_the_cli_import_it():
    """Stricter than the order: the launcher, though above it, does not."""
    users = [rel for rel in importers_of("bulkhead.verify", ".") if not rel.startswith("verify/")]
    assert users == ["cli.py"], users


def modules_loaded_by(module: str) -> set[str]:
    code = f"import sys, json; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(json.loads(out.stdout))


@pytest.mark.parametrize("module", ["bulkhead.serving.backend", "bulkhead.serving.info"])
def test_the_contract_package_loads_no_torch(module):
    loaded = modules_loaded_by(module)
    assert module in loaded and "torch" not in loaded


@pytest.mark.parametrize("module", ["bulkhead.engine.scheduler", "bulkhead.engine.fair_queue", "bulkhead.kv.ledger",
                                    "bulkhead.kv.prefix_cache", "bulkhead.lora.registry"])
def test_the_pure_core_loads_no_torch(module):
    """Pure Python over ints and ids (STYLE.md): testable without tensors,
    importable by a process that holds no model."""
    loaded = modules_loaded_by(module)
    assert module in loaded and "torch" not in loaded


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
