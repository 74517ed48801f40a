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
    """Heartbeat counters of every live worker, by worker name (as of each
    one's last heartbeat: up to HEARTBEAT_S old)."""
    return {w["name"]: w["counters"] for w in cluster.info()["workers"]}


def fresh_counters(cluster, timeout: float = 15.0) -> dict[str, dict]:
    """Like counters(), but from heartbeats built after this call: each
    worker's beat count must move by 2, because the beat that arrives first
    may have been built, and sent, before the call. Use it around a
    before/after comparison, where a stale beat miscounts."""
    seen = {w["name"]: w["heartbeats"] for w in cluster.info()["workers"]}

    def newer():
        workers = {w["name"]: w for w in cluster.info()["workers"]}
        if all(name in workers and workers[name]["heartbeats"] >= n + 2 for name, n in seen.items()):
            return {name: w["counters"] for name, w in workers.items()}
        return None

    return wait_for(newer, timeout, "two fresh heartbeats from every worker")


def total(cluster, counter: str, role: str | None = None, fresh: bool = False) -> int:
    """One counter summed over the live workers (of one role). fresh=True
    for a baseline: a stale one could already miss a count that a later
    wait then takes for the fault it is waiting for. Reads after a fresh one
    are at least as new."""
    snapshot = fresh_counters(cluster) if fresh else counters(cluster)
    return sum(c.get(counter, 0) for name, c in snapshot.items() if role is None or name.startswith(role))


def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    """Poll until predicate() is truthy (heartbeats report with up to 0.5 s delay)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout:.0f} s")
        time.sleep(0.1)
    return value


def arm(cluster, *faults: str) -> None:
    """Arm test-only faults on every worker (tests/faults/harness.py); they re-read the file when it changes."""
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
    pattern = f'"name": "{worker}", "router": "{control}"'  # in its --worker-config (disagg/launch.py)
    out = subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True, text=True).stdout.split()
    assert len(out) == 1, out
    return int(out[0])
