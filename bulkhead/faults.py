"""Test-only fault injection (disaggregated workers and the colocated server).

Armed only when the worker starts with BULKHEAD_FAULTS_FILE set; the file
holds fault names, one per line, and is re-read when it changes, so one
running deployment can go through many fault scenarios. Every fault that
fires is counted (heartbeat counters `fault_<name>`): a fault test asserts
that its fault really fired, so it cannot pass vacuously.

Faults (prefill side): corrupt_page, wrong_pages, short_transfer,
stale_generation, replay_control, withhold_drain_ack, slow_transfer.
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
KNOWN = ("corrupt_page", "wrong_pages", "short_transfer", "stale_generation", "replay_control",
         "withhold_drain_ack", "slow_transfer", "legacy_admission", "no_scrub")


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

    def counters(self) -> dict[str, int]:
        return {f"fault_{k}": v for k, v in self.fired.items()}
