"""A core lease: workers on one host take turns with every core.

`--role local` runs a prefill and a decode worker on one host's cores.
Split between them (`--core-sharing split`), a prompt gets one core of two
even when nothing decodes. Each with every core and no lease is worse: when
a prompt's pass and a decode step overlap, each one's OpenMP threads wait
at every barrier for a thread the other process took off its core. With the
lease each worker runs every core's threads and holds the lease for each
engine step (`turn`; ModelRunner.run too, for engines driven without one),
so a step has every core to itself and the workers' steps alternate.
Figures: docs/performance.md.

The lease is an flock(2) on a file the launcher names: the kernel releases
it when its holder dies, so a crashed worker never leaves the other
waiting. flock's lock belongs to the open file, so each worker opens the
path itself. It is reentrant within its process (a step's passes take it
inside the step's turn).

Turns alternate: flock wakes waiters in no order, and a worker that always
has work would take the lock back before the woken waiter ran. So a waiter
first says so (a shared lock on `<path>.want`), a worker takes a free lease
at once only while nobody says so, and a worker asking again waits behind
whoever already waits (an exclusive lock on the want file is granted once
every waiter has the lease).

A served engine does not wait for its turn blocked: a thread of the
lease's own waits on the files while the engine thread takes its commands
(`turn(meanwhile=...)`), so a decode worker's page grants and commits do
not wait out the prefill worker's step.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path


class CoreLease:
    """Held around an engine step or a model pass; waits while another
    process's step holds it."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._want_fd = os.open(self.path.with_name(self.path.name + ".want"), os.O_RDWR | os.O_CREAT, 0o600)
        self._depth = 0  # holds inside the lease: a turn, and the passes inside it
        self.acquired = 0  # times this process took the lease (the outermost hold)
        # The hand-over between the requester and the waiting thread, under _cond:
        self._cond = threading.Condition()
        self._wanted = False  # a turn is asked for (not granted to the requester, not given up)
        self._busy = False  # the waiting thread is waiting on the files (it uses this process's locks)
        self._granted = False  # the waiting thread holds the lease for the requester
        self._wake: Callable[[], None] = lambda: None
        self._closed = False
        self._waiter: threading.Thread | None = None

    def __enter__(self) -> CoreLease:
        if self._depth == 0:
            self._wait_in_order()
            self.acquired += 1
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def turn(self, meanwhile: Callable[[], None], wake: Callable[[], None],
             stopped: Callable[[], bool]) -> Iterator[bool]:
        """Hold the lease for one step. While the lease's own thread waits for
        it, this one calls meanwhile() (which blocks until wake() or other
        work arrives). Yields False, holding nothing, if stopped() came first."""
        held = self._try_take() or self._wait_off_thread(meanwhile, wake, stopped)
        try:
            yield held
        finally:
            if held:
                self.__exit__(None, None, None)

    @property
    def waiting(self) -> bool:
        """A turn has been asked for and is not held yet."""
        return self._wanted

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        os.close(self._fd)  # releases the lease, whoever took it
        os.close(self._want_fd)

    # -- taking it -------------------------------------------------------------
    def _try_take(self) -> bool:
        """Take a free lease now, unless another worker waits for it (its turn first)."""
        if self._depth > 0:
            self._depth += 1
            return True
        with self._cond:
            if self._busy or self._granted:  # the waiting thread is at work on these files
                return False
        try:
            fcntl.flock(self._want_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # refused while anyone waits
        except BlockingIOError:
            return False
        fcntl.flock(self._want_fd, fcntl.LOCK_UN)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self.acquired += 1
        self._depth += 1
        return True

    def _wait_in_order(self) -> None:
        """Block until this process holds the lease, behind the workers already waiting."""
        fcntl.flock(self._want_fd, fcntl.LOCK_EX)  # granted once every earlier waiter holds the lease
        fcntl.flock(self._want_fd, fcntl.LOCK_SH)  # (a conversion) now this one waits, for the holder to see
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        fcntl.flock(self._want_fd, fcntl.LOCK_UN)

    def _wait_off_thread(self, meanwhile: Callable[[], None], wake: Callable[[], None],
                         stopped: Callable[[], bool]) -> bool:
        with self._cond:
            self._wanted, self._wake = True, wake
            if self._waiter is None:
                self._waiter = threading.Thread(target=self._wait_turns, name="bulkhead-core-lease", daemon=True)
                self._waiter.start()
            self._cond.notify()
        try:
            while True:
                with self._cond:
                    if self._granted:
                        self._granted = self._wanted = False
                        self.acquired += 1
                        self._depth += 1
                        return True
                if stopped():
                    return False
                meanwhile()
        finally:
            with self._cond:
                if self._wanted:  # given up (stopped, or meanwhile() raised)
                    self._wanted = False
                    if self._granted:  # granted after the last look: give it back
                        self._granted = False
                        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _wait_turns(self) -> None:
        """The waiting thread: one wait on the files per turn asked for."""
        while True:
            with self._cond:
                while not ((self._wanted and not self._granted) or self._closed):
                    self._cond.wait()
                if self._closed:
                    return
                self._busy = True
            self._wait_in_order()
            with self._cond:
                self._busy = False
                if self._wanted:
                    self._granted = True
                    wake = self._wake
                else:  # given up while this thread waited
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                    continue
            wake()
