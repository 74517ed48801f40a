"""ZeroMQ sockets of the control plane, each owned by one thread.

The router binds one ROUTER socket; every worker connects one DEALER socket
to it. Other threads never touch a socket: they enqueue with `send()` and the
owning thread flushes the queue between polls.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import zmq

from bulkhead.disagg.signing import Signer

log = logging.getLogger(__name__)

POLL_MS = 2


class _Link:
    def __init__(self, signer: Signer):
        self.signer = signer
        self._ctx = zmq.Context.instance()
        self._out: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, on_message: Callable, on_tick: Callable[[], None] | None = None) -> None:
        # Bind/connect here, so a taken port fails the start instead of a thread.
        sock = self._open()
        self._thread = threading.Thread(target=self._loop, args=(sock, on_message, on_tick), daemon=True,
                                        name=f"bulkhead-{self.signer.sender}-link")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self, sock, on_message, on_tick) -> None:
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        while not self._stop.is_set():
            self._flush(sock)
            if poller.poll(POLL_MS):
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        self._deliver(frames, on_message)
                    except Exception:  # one bad message must not take the control plane down
                        log.exception("handling a control message failed")
            if on_tick is not None:
                try:
                    on_tick()
                except Exception:
                    log.exception("control-plane tick failed")
        sock.close(linger=200)

    def _deliver(self, frames, on_message) -> None:
        raise NotImplementedError

    def _open(self):
        raise NotImplementedError

    def _flush(self, sock) -> None:
        raise NotImplementedError


class WorkerLink(_Link):
    """A worker's connection to the router."""

    def __init__(self, signer: Signer, router_address: str):
        super().__init__(signer)
        self.router_address = router_address

    def send(self, message: dict) -> None:
        self._out.put(message)

    def _open(self):
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.signer.sender.encode())
        sock.connect(self.router_address)
        return sock

    def _flush(self, sock) -> None:
        while True:
            try:
                message = self._out.get_nowait()
            except queue.Empty:
                return
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
        self._out.put((worker, message))

    def _open(self):
        sock = self._ctx.socket(zmq.ROUTER)
        # Unroutable messages raise instead of vanishing; sends never block.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDTIMEO, 0)
        sock.bind(self.bind_address)
        return sock

    def _flush(self, sock) -> None:
        while True:
            try:
                worker, message = self._out.get_nowait()
            except queue.Empty:
                return
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
