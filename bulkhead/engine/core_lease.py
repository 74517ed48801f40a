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

A served engine holds it for a whole step (Engine._step_in_turn) and does
not wait for it blocked: it asks for a turn (`request`), a thread of the
lease's own blocks on the file and says when the turn is held, and
meanwhile the engine thread takes its commands. A decode worker's page
grants and commits run on its engine thread, so a blocked wait held every
prompt's hand-over until the prefill worker's next pass ended.
"""

from __future__ import annotations

import fcntl
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path


class CoreLease:
    """Held around a model pass; blocks while another process's pass holds it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._depth = 0  # holds inside the lease: a turn, passes (interjection nests them)
        self.acquired = 0  # times this process took the lease (the outermost hold)
        self._requests: queue.SimpleQueue = queue.SimpleQueue()  # request()s, for the waiting thread
        self._turn = threading.Event()  # the waiting thread holds the lease for the requester
        self._waiter: threading.Thread | None = None

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

    # -- a turn, waited for off the caller's thread ----------------------------
    def try_turn(self) -> bool:
        """Take a turn now if no other process holds the lease (True; give it
        back with end_turn()): no thread hand-over where nobody competes."""
        if self._depth == 0:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            self.acquired += 1
        self._depth += 1
        return True

    def request(self, granted: Callable[[], None]) -> None:
        """Ask for a turn without waiting: granted() is called (on the lease's
        own thread) once this process holds the lease; the requester then
        takes it with take_turn() and gives it back with end_turn()."""
        if self._waiter is None:
            self._waiter = threading.Thread(target=self._wait_turns, name="bulkhead-core-lease", daemon=True)
            self._waiter.start()
        self._requests.put(granted)

    def take_turn(self) -> bool:
        """True, and the turn is the caller's (a hold like `with`), once the
        requested turn is held; False while it is still being waited for."""
        if not self._turn.is_set():
            return False
        self._turn.clear()
        self._depth += 1
        self.acquired += 1
        return True

    def end_turn(self) -> None:
        self.__exit__(None, None, None)

    def _wait_turns(self) -> None:
        while True:
            granted = self._requests.get()
            if granted is None:
                return
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            self._turn.set()
            granted()

    def close(self) -> None:
        if self._waiter is not None:
            self._requests.put(None)
        os.close(self._fd)  # releases the lease, whoever took it
