"""A rolling restart under steady load, shared by its test and by
bench/rolling_restart.py: each worker in turn gets SIGTERM (drain, then
exit) and a fresh process takes its name, while clients keep sending."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from dataclasses import dataclass, field

from tests.disagg.cluster_tools import wait_for
from tests.faults.checks import greedy
from tests.faults.fault_cluster import WORKERS


@dataclass
class RollResult:
    served: int = 0
    failed: list[str] = field(default_factory=list)
    exit_codes: dict[str, int] = field(default_factory=dict)
    drain_seconds: dict[str, float] = field(default_factory=dict)  # SIGTERM to exit
    seconds: float = 0.0


def all_live(cluster) -> bool:
    """Every worker registered and taking requests: a replacement has
    registered (the entry of the one that left said drained until then)."""
    states = {w["name"]: w["state"] for w in cluster.info()["workers"]}
    return states == {name: "live" for name in WORKERS}


def roll(cluster, clients: int = 3, max_tokens: int = 12) -> RollResult:
    result = RollResult()
    stop = threading.Event()
    lock = threading.Lock()

    def client() -> None:
        while not stop.is_set():
            try:
                greedy(cluster, max_tokens=max_tokens, salt=uuid.uuid4().hex)
                with lock:
                    result.served += 1
            except Exception as e:  # any failure at all is the finding
                with lock:
                    result.failed.append(repr(e))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.monotonic()
    for t in threads:
        t.start()
    try:
        for name in WORKERS:
            before = result.served
            proc = cluster.workers[name]
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            result.exit_codes[name] = proc.wait(timeout=90)  # drained, then exited on its own
            result.drain_seconds[name] = round(time.monotonic() - sent, 1)
            cluster.start_worker(name)
            wait_for(lambda: all_live(cluster), timeout=180, what=f"{name}'s replacement registered")
            while result.served < before + 2 and not result.failed:  # the load ran through this step
                time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    result.seconds = round(time.monotonic() - started, 1)
    return result
