"""`bulkhead serve`'s command line: help that shows defaults and agrees with
/server_info, and "serving on" only once the port is bound (issue 16 item 6)."""

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
        main(["serve", "--help"])
    return " ".join(out.getvalue().split())  # argparse wraps lines: compare words


@pytest.mark.parametrize("flag, default", [("--port", "default 8000"), ("--dtype", "default float32"),
                                           ("--log-level", "default info")])
def test_flags_say_what_they_do_and_show_their_default(serve_help, flag, default):
    after = serve_help.split(flag, 2)[-1]  # the option's own help, after its usage entry
    assert default in after.split(" --")[0], after[:300]


def test_linear_kernel_help_says_what_server_info_says_about_bf16(serve_help):
    # Issue 16: the help said int4 ran prompts in bf16; /server_info and the README say prompts stay fp32.
    for words in (MATMUL_PRECISION["int4"], MATMUL_PRECISION["q4-bf16in"], MATMUL_PRECISION["q4-bf16in-all"],
                  MATMUL_PRECISION["q4-i16in"], HEAD_PRECISION["bf16w"], HEAD_PRECISION["q8-i16in"]):
        assert " ".join(words.split()) in serve_help
    assert "bf16 for prompts" not in serve_help


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
