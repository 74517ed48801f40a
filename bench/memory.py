"""Peak RSS of a process tree (a server and the workers it started), sampled
in a background thread while a benchmark level runs.

RSS is summed over the processes (bench/proc_memory.py reads /proc), as `ps`
would show them: a page two processes share counts twice. For bulkhead
disaggregated that is the decode worker's KV pool, which prefill maps too
(shm transfer).
"""

from __future__ import annotations

import threading

from bench.proc_memory import MemoryTrace

MIB = 2**20


class PeakMemory:
    """with PeakMemory(pid) as peak: ...; then peak.rss_mib."""

    def __init__(self, pid: int, interval_s: float = 0.25):
        self.trace = MemoryTrace(pid)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.trace.sample()

    def __enter__(self) -> PeakMemory:
        self.trace.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.trace.sample()

    @property
    def rss_mib(self) -> float:
        return self.trace.peak / MIB
