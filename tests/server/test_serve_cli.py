"""`bulkhead serve`'s command line: a kernel doc that agrees with /server_info
(every flag's default: test_serve_help.py), and "serving on" only once the port is bound (issue 16 item 6)."""

import socket
import subprocess
import sys

import pytest

from bulkhead.cli import main
from bulkhead.model.linear_kernel import HEAD_PRECISION, MATMUL_PRECISION
from tests.server_process import ROOT


@pytest.fixture(scope="module")
def serve_help():
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["serve", "--help-all"])
    return " ".join(out.getvalue().split())  # argparse wraps lines: compare words


def test_the_kernel_flags_doc_says_what_server_info_says_about_bf16(serve_help):
    # Issue 16: the help said int4 ran prompts in bf16; /server_info says prompts stay fp32. The help now
    # points at /server_info and docs/performance.md, whose table must say what /server_info says.
    doc = " ".join((ROOT / "docs" / "performance.md").read_text().split())
    for kernel, words in MATMUL_PRECISION.items():
        assert f"| `{kernel}` | {words} |" in doc, kernel
    for kernel, words in HEAD_PRECISION.items():
        assert f"| `{kernel}` | {words} |" in doc, kernel
    assert "matmul_precision" in serve_help and "bf16 for prompts" not in serve_help + doc


def test_serving_on_is_logged_only_once_the_port_is_bound(tiny_model_dir):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "bulkhead.cli", "serve", "--role", "colocated", "--model",
                              str(tiny_model_dir), "--kv-memory", "64MiB", "--port", str(port)],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "address already in use" in out.lower(), out
    assert f"on http://127.0.0.1:{port}/v1" not in out, out  # the "serving ... on URL" line


def test_a_bound_server_says_where_it_serves(tiny_server):
    assert f"on http://127.0.0.1:{tiny_server.port}/v1" in tiny_server.log()
