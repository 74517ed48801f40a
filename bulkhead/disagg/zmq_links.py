"""ZeroMQ sockets of the control plane, each owned by one thread.

The router binds one ROUTER socket; every worker connects one DEALER socket
to it. Other threads never touch a socket: they enqueue with `send()`, and
the owning thread, woken by its socket or by a byte in the link's wake-up
pipe, flushes the queue. Why a pipe and not a short poll: three link threads
polling every 2 ms woke 1,500 times a second between them, each wake-up
taking a core from a worker's OpenMP team, whose partner then waited at the
next barrier. Only the first send since the last flush writes the byte: a
decode step's tokens leave in one flush (a byte per send doubled the router
link's CPU time).
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable

import zmq

from bulkhead.disagg.signing import Signer

log = logging.getLogger(__name__)

# How often on_tick runs: heartbeats, grant retries and deadlines; sends and
# messages never wait for it. Each tick wakes the link thread and takes a core
# from a worker: at 10 ms the prefill link woke 1,652 times in one 16-client
# run, nearly all ticks; at 50 ms 394.
TICK_S = 0.05


def _wait_ms(deadline: float) -> int:
    """Milliseconds until deadline, rounded up: zmq's poll takes whole
    milliseconds, and a wait under one, passed as 0, returned at once (a spin
    until the tick: 22,378 polls in 50 ms, measured)."""
    return max(0, math.ceil((deadline - time.monotonic()) * 1000))


class _Link:
    def __init__(self, signer: Signer):
        self.signer = signer
        self._ctx = zmq.Context.instance()
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()  # a byte in it: something was queued (module docstring)
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # Closed with the link object, never when its thread ends: a send()
        # after stop() must not write into a descriptor number reused since.
        weakref.finalize(self, lambda r, w: (os.close(r), os.close(w)), self._wake_r, self._wake_w)
        self.polls = 0  # times the link thread's poll returned, ticks included (tests: an idle link sleeps)
        self._wake_lock = threading.Lock()
        self._wake_pending = False  # a wake-up byte is on its way and the queue not yet flushed

    def _enqueue(self, item) -> None:
        """Any thread: hand item to the link thread, waking it for the first
        item since its last flush only (a decode step's tokens, sent one after
        another while the link thread waits for the GIL, leave in one flush)."""
        with self._wake_lock:
            self._out.put(item)
            if self._wake_pending:
                return
            self._wake_pending = True
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except OSError:  # full of wake-ups already (the thread will run), or closed by the finalizer at exit
            pass

    def start(self, on_message: Callable, on_tick: Callable[[], None] | None = None) -> None:
        # Bind/connect here, so a taken port fails the start instead of a thread.
        sock = self._open()
        self._thread = threading.Thread(target=self._loop, args=(sock, on_message, on_tick), daemon=True,
                                        name=f"bulkhead-{self.signer.sender}-link")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self, sock, on_message, on_tick) -> None:
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        next_tick = time.monotonic()
        while not self._stop.is_set():
            with self._wake_lock:
                self._wake_pending = False  # before the flush: anything queued after it wakes us again
            self._flush(sock)
            ready = dict(poller.poll(_wait_ms(next_tick) if on_tick is not None else None))
            self.polls += 1
            if self._wake_r in ready and not self._drain_wakeups():
                break  # the pipe was closed: the interpreter is exiting
            if sock in ready:
                self._receive_all(sock, on_message)
            if on_tick is not None and time.monotonic() >= next_tick:
                next_tick = time.monotonic() + TICK_S
                try:
                    on_tick()
                except Exception:
                    log.exception("control-plane tick failed")
        sock.close(linger=200)

    def _receive_all(self, sock, on_message) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self._deliver(frames, on_message)
            except Exception:  # one bad message must not take the control plane down
                log.exception("handling a control message failed")

    def _drain_wakeups(self) -> bool:
        """Empty the wake-up pipe; False once it is closed (the link object
        was finalized at exit while its daemon thread still ran)."""
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            return True
        except OSError:
            return False
        return True

    def _flush(self, sock) -> None:
        while True:
            try:
                item = self._out.get_nowait()
            except queue.Empty:
                return
            self._send(sock, item)

    # A link's kind supplies _open() (its socket), _send(sock, item) and _deliver(frames, on_message).


class WorkerLink(_Link):
    """A worker's connection to the router."""

    def __init__(self, signer: Signer, router_address: str):
        super().__init__(signer)
        self.router_address = router_address

    def send(self, message: dict) -> None:
        self._enqueue(message)

    def _open(self):
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.signer.sender.encode())
        sock.connect(self.router_address)
        return sock

    def _send(self, sock, message: dict) -> None:
        self.transmit(sock, message, self.signer.seal(message))

    def transmit(self, sock, message: dict, frames: list[bytes]) -> None:
        """Put one sealed message on the wire. The seam where a harness's
        link (tests/faults) loses, holds back or repeats a message."""
        sock.send_multipart(frames)

    def _deliver(self, frames, on_message) -> None:
        message = self.signer.open(frames)
        if message is not None:
            on_message(message)


class RouterLink(_Link):
    """The router's socket: workers are addressed by name."""

    def __init__(self, signer: Signer, bind_address: str, on_undeliverable: Callable[[str, dict], None]):
        """on_undeliverable(worker, message): called on the link thread when a
        message cannot be handed to its worker, so no request waits for it."""
        super().__init__(signer)
        self.bind_address = bind_address
        self._on_undeliverable = on_undeliverable

    def send(self, worker: str, message: dict) -> None:
        self._enqueue((worker, message))

    def _open(self):
        sock = self._ctx.socket(zmq.ROUTER)
        # Unroutable messages raise instead of vanishing; sends never block.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDTIMEO, 0)
        sock.bind(self.bind_address)
        return sock

    def _send(self, sock, item: tuple[str, dict]) -> None:
        worker, message = item
        try:
            sock.send_multipart([worker.encode(), *self.signer.seal(message)])
        except zmq.ZMQError as e:
            log.warning("cannot send %s to %s: %s", message.get("kind"), worker, e)
            self._on_undeliverable(worker, message)

    def _deliver(self, frames, on_message) -> None:
        identity, rest = frames[0].decode(errors="replace"), frames[1:]
        message = self.signer.open(rest)
        if message is None:
            return
        if message.get("_from") != identity:
            self.signer.stats.dropped_bad_mac += 1  # a valid MAC from another socket: spoofing
            return
        on_message(identity, message)
