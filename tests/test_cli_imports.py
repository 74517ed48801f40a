"""The operator's commands start without loading the server: `bulkhead admin`,
`lineage` and `plan` import neither torch nor FastAPI (`serve`'s flags and the
simulator's runner, which do, load only for their own commands). Importing
them was most of the ~4 s that `bulkhead admin workers URL` took a call.
A fresh interpreter each, so the modules other tests loaded do not count."""

import subprocess
import sys

import pytest

HEAVY = ("torch", "fastapi", "bulkhead.engine.engine", "bulkhead.launch.serve")

PROBE = """
import sys
from bulkhead.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("LOADED", [m for m in {heavy!r} if m in sys.modules])
"""


@pytest.mark.parametrize("argv", [
    ["admin", "workers", "http://127.0.0.1:9"],  # port 9 (discard): refused at once, exit 3
    ["lineage", "verify", "--key", "/nonexistent.key", "lineage.jsonl"],
    ["plan", "--help"],
])
def test_operator_commands_load_no_torch_and_no_server(argv):
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), *argv], capture_output=True, text=True,
                         timeout=120)
    assert "LOADED []" in out.stdout, out.stdout + out.stderr


def test_serve_still_has_its_flags():
    out = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), "serve", "--help"], capture_output=True,
                         text=True, timeout=120)
    # Its flags read the kernels' names from bulkhead.model.kernel_names, so even
    # serve's parser loads no torch: a router process never does.
    assert "--lineage-log" in out.stdout and "torch" not in out.stdout.split("LOADED")[1], out.stdout + out.stderr


def test_python_dash_m_bulkhead_runs_the_same_command():
    run = subprocess.run([sys.executable, "-m", "bulkhead", "plan", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: bulkhead plan")
