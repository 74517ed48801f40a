"""Helpers for tests that drive a running cluster (router + worker processes)
through its HTTP API: read its counters, arm test-only faults, wait for it to
settle. Shared by tests/disagg and the fault matrix (tests/faults).

A `cluster` here is anything with `info()` (the router's /server_info),
`faults_file` (the BULKHEAD_FAULTS_FILE every worker reads) and `port`.
"""

from __future__ import annotations

import subprocess
import time


def counters(cluster) -> dict[str, dict]:
    """Heartbeat counters of every live worker, by worker name."""
    return {w["name"]: w["counters"] for w in cluster.info()["workers"]}


def total(cluster, counter: str, role: str | None = None) -> int:
    """One counter summed over the live workers (of one role)."""
    return sum(c.get(counter, 0) for name, c in counters(cluster).items() if role is None or name.startswith(role))


def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    """Poll until predicate() is truthy (heartbeats report with up to 0.5 s delay)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout:.0f} s")
        time.sleep(0.1)
    return value


def arm(cluster, *faults: str) -> None:
    """Arm test-only faults on every worker (bulkhead/faults.py); they re-read the file when it changes."""
    cluster.faults_file.write_text("\n".join(faults) + "\n")
    time.sleep(0.05)


def disarm(cluster) -> None:
    cluster.faults_file.unlink(missing_ok=True)


def wait_workers_idle(cluster, timeout: float = 30.0) -> list[dict]:
    """Wait until no worker holds a request's page or an unscrubbed one; returns the workers."""
    deadline = time.monotonic() + timeout
    while True:
        workers = cluster.info()["workers"]
        busy = {w["name"]: (w["owned_pages"], w["dirty_pages"]) for w in workers if w["owned_pages"] or w["dirty_pages"]}
        if not busy:
            return workers
        if time.monotonic() > deadline:
            raise TimeoutError(f"workers still hold (owned, dirty) pages: {busy}")
        time.sleep(0.1)


def pid_of(cluster, worker: str) -> int:
    """The pid of one worker process of this cluster (found by its command line)."""
    # The control address (HTTP port + 1) tells this cluster's workers from any other's.
    control = f"tcp://127.0.0.1:{cluster.port + 1}"
    pattern = f"--router {control} .*--worker-name {worker} "
    out = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True).stdout.split()
    assert len(out) == 1, out
    return int(out[0])
