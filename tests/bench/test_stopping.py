"""bench/stopping.py: a benchmark told to stop (SIGTERM) still runs its
`finally` blocks, which stop its servers, and passes the stop on to a child
run instead of killing it outright."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A stand-in for bench/peers.py: it holds a "server" (a file) that only its
# `finally` removes, says it is ready, and waits to be stopped.
HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from bench import stopping
    stopping.exit_on_sigterm()
    held = Path(sys.argv[1])
    held.write_text("server")
    try:
        print("ready", flush=True)
        time.sleep(60)
    finally:
        held.unlink()
""")

# A stand-in for bench/rounds.py: it runs the holder through run_child.
PARENT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from bench import stopping
    stopping.exit_on_sigterm()
    stopping.run_child([sys.executable, sys.argv[1], sys.argv[2]])
""")


# A stand-in for bench/peers.py running its vLLM half in a network namespace.
NETNS_PARENT = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    from bench import peers, stopping
    stopping.exit_on_sigterm()
    peers.run_in_fresh_netns([sys.executable, sys.argv[1], sys.argv[2]], dict(os.environ))
""")


def wait_for(path: Path, present: bool, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() == present:
            return True
        time.sleep(0.05)
    return False


def test_sigterm_runs_the_finally_that_stops_the_servers(tmp_path):
    holder = tmp_path / "holder.py"
    holder.write_text(HOLDER.format(root=str(ROOT)))
    held = tmp_path / "server"
    proc = subprocess.Popen([sys.executable, str(holder), str(held)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert not held.exists()  # the finally ran: without exit_on_sigterm the file stays


def stop_parent_and_see_the_child_stop(tmp_path, parent_source: str) -> bool:
    """Start parent_source (a stand-in for rounds.py or peers.py) running the
    holder, wait for the holder's "server", SIGTERM the parent: it exits with
    143, and the result says whether the holder then removed its "server"."""
    holder, parent = tmp_path / "holder.py", tmp_path / "parent.py"
    holder.write_text(HOLDER.format(root=str(ROOT)))
    parent.write_text(parent_source.format(root=str(ROOT)))
    held = tmp_path / "server"
    proc = subprocess.Popen([sys.executable, str(parent), str(holder), str(held)])
    assert wait_for(held, present=True)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    return wait_for(held, present=False)


def test_a_stopped_parent_passes_the_stop_to_its_child_run(tmp_path):
    # The child stopped its "server": subprocess.run would SIGKILL it.
    assert stop_parent_and_see_the_child_stop(tmp_path, PARENT)


def test_a_stopped_run_passes_the_stop_into_its_network_namespace(tmp_path):
    from bench import peers

    try:
        peers.unshare_net()
    except RuntimeError as e:
        pytest.skip(str(e))
    if shutil.which("ip") is None:
        pytest.skip("no `ip` to bring up the namespace's loopback")
    # vLLM's engine processes outlived such a stop under subprocess.run.
    assert stop_parent_and_see_the_child_stop(tmp_path, NETNS_PARENT)
