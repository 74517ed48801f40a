"""Every script in bench/ imports: a renamed module must not leave a
benchmark that fails at its first line (bench/noisy_neighbour.py once
imported a module that had moved to tests/)."""
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in (ROOT / "bench").glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_script_imports(script, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    spec = importlib.util.spec_from_file_location(f"bench_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)  # top level only: main() runs under __main__
