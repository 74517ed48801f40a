"""A core lease: workers on one host take turns with every core.

`--role local` runs a prefill and a decode worker on the host's cores. Split
between them (each worker its share of the cores, `--core-sharing split`),
a prompt gets one core of two even when nothing is decoding, and a decode
step one core even when no prompt waits. Sharing every core at once (each
worker all the threads, no lease) is worse still: when a prompt's pass and a
decode step overlap, each one's OpenMP threads wait at every barrier for a
thread the other process has taken off its core.

With the lease each worker runs all the cores' threads, and holds the lease
for each model pass (ModelRunner.run): a pass has every core to itself, as
in one colocated process, and the two workers' passes alternate. What a
worker does outside a pass (sampling, sending KV, messages) runs beside the
other's pass. Measured against the split (bench/peers.py, the default
deployment, this 2-core machine, back to back): 86.1 vs 66.5 tok/s at 1
client, 162.3 vs 161.9 at 16 with a p99 time to first token of 6.51 vs
12.05 s; 0.97x colocated's throughput at 16 in one run with it
(docs/performance.md).

The lease is an flock(2) on a file the launcher names: the kernel releases
it when its holder's process dies, so a crashed worker never leaves the
other waiting. flock's lock belongs to the open file, so each worker opens
the path itself (an inherited descriptor would share one lock between the
two). It is reentrant within its process: a pass that another pass runs
between its layers (bulkhead.engine.engine, interjection) already holds it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class CoreLease:
    """Held around a model pass; blocks while another process's pass holds it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._depth = 0  # passes of this process inside the lease (interjection nests them)
        self.acquired = 0  # times this process took the lease (the outermost hold)

    def __enter__(self) -> CoreLease:
        if self._depth == 0:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            self.acquired += 1
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)
