"""Test-only fault injection (disaggregated workers and the colocated server).

Armed only when the worker starts with BULKHEAD_FAULTS_FILE set; the file
holds fault names, one per line, and is re-read when it changes, so one
running deployment can go through many fault scenarios. Every fault that
fires is counted (heartbeat counters `fault_<name>`): a fault test asserts
that its fault really fired, so it cannot pass vacuously.

Faults (prefill side): corrupt_page, wrong_pages, short_transfer,
stale_generation, replay_control, withhold_drain_ack, slow_transfer.
Fault matrix (tests/faults/, docs/reliability.md), each fired at one line:
  stall_prefill           prefill: the engine thread is busy STALL_S before the
                          request reaches it (the request waits queued)
  stall_past_grant        prefill: the writer starts after the grant's
                          write_within_s (it must write nothing)
  stall_transfer          prefill: the write waits until the router has
                          finalized the request (its deadline), then lands
  crash_after_grant       prefill: os._exit on receiving decode's grant
  crash_before_manifest   prefill: os._exit after writing, before transfer_done
  stall_verify            decode: the engine thread is busy STALL_S before the
                          coverage check
  crash_before_commit     decode: os._exit on receiving transfer_done
  lose_<kind>             any worker: while armed, its <kind> control messages
                          are never sent
  reorder_<kind>          any worker: a <kind> message is held and sent after
                          the one that follows it (kinds in CONTROL_KINDS)
Colocated server: legacy_admission (serve an over-length request the way the
incident's engine did, see engine/legacy.py) and no_scrub (freed pages keep
their KV). These two exist so `bulkhead probe` can be shown to catch the
incident; never set BULKHEAD_FAULTS_FILE in production.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

ENV = "BULKHEAD_FAULTS_FILE"
# Worker-to-router messages a link fault can lose or reorder.
CONTROL_KINDS = ("prefill_ready", "pages_granted", "transfer_done", "drain_ack")
KNOWN = ("corrupt_page", "wrong_pages", "short_transfer", "stale_generation", "replay_control",
         "withhold_drain_ack", "slow_transfer", "legacy_admission", "no_scrub",
         "stall_prefill", "stall_past_grant", "stall_transfer", "crash_after_grant", "crash_before_manifest",
         "stall_verify", "crash_before_commit",
         *(f"{how}_{kind}" for how in ("lose", "reorder") for kind in CONTROL_KINDS))
STALL_S = 2.0  # stall_prefill, stall_verify: long enough for a client to leave meanwhile
CRASH_STATUS = 137  # what a kill -9 leaves; os._exit skips every cleanup, as a crash would


def pause(seconds: float = STALL_S) -> None:
    """A stall fault's wait (a thread that is busy, or a slow network)."""
    time.sleep(seconds)


def wait_until(condition, timeout_s: float = 60.0) -> None:
    """A stall that lasts until something else happens (a deadline fires)."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


class Faults:
    def __init__(self, path: str | None = None):
        path = path if path is not None else os.environ.get(ENV)
        self.path = Path(path) if path else None
        self._mtime = None
        self._armed: frozenset[str] = frozenset()
        self.fired: dict[str, int] = {}

    def armed(self, name: str) -> bool:
        if self.path is None:
            return False
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            self._armed, self._mtime = frozenset(), None
            return False
        if mtime != self._mtime:
            names = {line.strip() for line in self.path.read_text().splitlines() if line.strip()}
            unknown = names - set(KNOWN)
            if unknown:
                raise ValueError(f"unknown faults in {self.path}: {sorted(unknown)}")
            self._armed, self._mtime = frozenset(names), mtime
        return name in self._armed

    def fire(self, name: str) -> bool:
        """True (and counted) when `name` is armed."""
        if not self.armed(name):
            return False
        self.fired[name] = self.fired.get(name, 0) + 1
        if name == "slow_transfer":
            time.sleep(2.0)
        return True

    def crash(self, name: str) -> None:
        """Die on the spot, like kill -9, when `name` is armed. The counter
        would die with the process, so the crash is recorded first in
        `<faults file>.crashed`, one line per crash, for the test to read."""
        if self.fire(name):
            with open(f"{self.path}.crashed", "a") as f:
                f.write(name + "\n")
            os._exit(CRASH_STATUS)

    def counters(self) -> dict[str, int]:
        return {f"fault_{k}": v for k, v in self.fired.items()}
