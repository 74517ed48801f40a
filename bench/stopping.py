"""Stopping a benchmark cleanly when it is told to stop.

Why: a benchmark run holds live servers (bulkhead's router and workers,
each with a KV pool in /dev/shm; vLLM; llama-server), stopped by the
`finally` of the context that started them. Python's default answer to
SIGTERM ends the process without running any `finally`: a `bench/peers.py`
killed that way left its bulkhead server running, orphaned, with its 1 GiB
pool, for 45 minutes of later measurements (docs/performance.md). And
`subprocess.run`, interrupted, kills its child with SIGKILL, which again
runs no `finally` in the child: `bench/rounds.py` would orphan the servers
of the `bench/peers.py` it runs.
"""

from __future__ import annotations

import signal
import subprocess


def exit_on_sigterm() -> None:
    """From now on SIGTERM raises SystemExit(143) in the main thread, so that
    every `with` and `finally` on the way out runs (servers are stopped)."""
    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def run_child(cmd: list[str], env: dict | None = None) -> int:
    """Run cmd to its end and return its exit status. Stopped meanwhile (SIGTERM,
    SIGINT), this passes SIGTERM on and waits for the child to stop on its own
    (it stops its servers), instead of killing it outright."""
    child = subprocess.Popen(cmd, env=env)
    try:
        return child.wait()
    except BaseException:
        child.terminate()
        child.wait()
        raise
