"""The local workers' watch: a decode worker that dies leaves no KV behind.

Killed (SIGKILL, the OOM killer, a crash), a decode worker cannot unlink its
pool file under /dev/shm (transfer "shm"), which holds its tenants' KV, and
it stayed until the next `bulkhead serve` swept it at start-up. `--role
local` started the workers, so it sees each one exit and sweeps at once.
"""

from __future__ import annotations

import logging
import subprocess
import threading

log = logging.getLogger("bulkhead")

POLL_S = 0.5  # how soon after a worker's death its pool file goes


class WorkerWatch:
    """Polls the local worker processes every POLL_S until stop(); when one
    has exited, logs it and (shm transfer) removes every pool file whose
    process is gone."""

    def __init__(self, workers: list[subprocess.Popen], transfer: str, shm_dir: str | None = None):
        self._workers, self._transfer, self._shm_dir = list(workers), transfer, shm_dir
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-watch", daemon=True)
        self.swept: list[str] = []

    def start(self) -> WorkerWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        seen = set()
        while not self._stop.wait(POLL_S):
            exited = [p for p in self._workers if p.pid not in seen and p.poll() is not None]
            for proc in exited:
                seen.add(proc.pid)
                # 0: it drained and left (an operator's drain); else it died.
                (log.info if proc.returncode == 0 else log.error)("worker pid %d exited with status %s", proc.pid,
                                                                  proc.returncode)
            if exited and self._transfer == "shm":
                from bulkhead.disagg.transfer.shm import SHM_DIR, sweep_stale_files

                for path in sweep_stale_files(self._shm_dir or SHM_DIR):
                    log.info("removed the KV pool file of a dead decode worker: %s", path)
                    self.swept.append(path)
