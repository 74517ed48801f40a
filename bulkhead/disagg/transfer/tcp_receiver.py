"""The tcp backend's decode side: a receiver thread that writes pages into the pool.

This backend sees every write, so it is the one that runs the write guard:
for each page, under `write_lock`, guard(dst_page, dst_generation,
request_id) decides whether the page is copied in or dropped (counted in
writes_refused and named in the ack, which makes the source raise).
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socket
import threading

import torch

from bulkhead.disagg.transfer import tcp_framing as wire
from bulkhead.disagg.transfer.base import TransferTarget
from bulkhead.disagg.transfer.page_copy import copy_pages
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.pool import KVPool

log = logging.getLogger(__name__)

_STAGE_PAGES = 16  # pages received before one vectorised copy into the pool (~12 MB for SmolLM2 fp32)
_ACCEPT_POLL_S = 0.2  # how often the accept loop notices close()


class Target(TransferTarget):
    name = "tcp"
    sees_writes = True

    def __init__(self, layout: KVLayout, num_pages: int, scrub_mode: str = "zero",
                 host: str = "127.0.0.1", port: int = 0):
        """host: the address to listen on. Loopback by default: the data plane
        binds only where the operator says (invariant 9), never 0.0.0.0 unasked."""
        super().__init__()
        self.pool = KVPool(layout, num_pages, scrub_mode)
        self._page_shape = tuple(self.pool.data[0].shape)  # [L, 2, ps, H, D]
        self._page_bytes = self.pool.data[0].numel() * self.pool.data.element_size()
        self._token = secrets.token_hex(16)  # reaches prefill only inside the HMAC'd control plane
        self._listener = socket.create_server((host, port))
        self._listener.settimeout(_ACCEPT_POLL_S)
        self.host, self.port = self._listener.getsockname()[:2]
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._stats = {"backend": "tcp", "bytes_received": 0, "pages_written": 0, "writes_refused": 0,
                       "batches": 0, "bad_frames": 0}
        self._stats_lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept_loop, name="kv-tcp-accept", daemon=True)
        self._thread.start()

    def descriptor(self) -> dict:
        return {"backend": "tcp", "host": self.host, "port": self.port, "token": self._token,
                "shape": list(self.pool.data.shape), "dtype": self.pool.layout.dtype}

    def stats(self) -> dict:
        with self._stats_lock:
            return dict(self._stats)

    def _count(self, **deltas: int) -> None:
        with self._stats_lock:
            for k, v in deltas.items():
                self._stats[k] += v

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join(timeout=5)
        self._listener.close()
        for conn in list(self._conns):
            try:
                conn.shutdown(socket.SHUT_RDWR)  # wakes a handler blocked in recv
            except OSError:
                pass

    # -- receiving ---------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="kv-tcp-recv", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        stage = torch.empty((_STAGE_PAGES, *self._page_shape), dtype=self.pool.data.dtype)
        try:
            while not self._closed.is_set():
                header = wire.recv_header(conn)
                if not hmac.compare_digest(header.token, self._token):
                    # unauthenticated: answer once and hang up without reading its body
                    self._count(bad_frames=1)  # counted before the ack, so a source that saw it sees this
                    wire.send_ack(conn, 0, [], "bad session token")
                    return
                error = self._check(header)
                if error is not None:
                    self._discard(conn, len(header.pages) * header.page_bytes)
                    self._count(bad_frames=1)
                    wire.send_ack(conn, 0, [], error)
                    continue
                written, refused = self._receive_batch(conn, header, stage)
                self._count(batches=1)
                wire.send_ack(conn, written, refused, None)
        except (wire.WireError, OSError) as e:
            if not self._closed.is_set():
                log.info("kv tcp receiver: connection ended: %s", e)
        finally:
            self._conns.discard(conn)
            conn.close()

    def _check(self, h: wire.BatchHeader) -> str | None:
        if h.page_bytes != self._page_bytes:
            return f"page is {h.page_bytes} bytes on prefill, {self._page_bytes} here: KV layouts differ"
        dst = [p for p, _ in h.pages]
        bad = [p for p in dst if not 0 <= p < self.pool.num_pages]
        if bad:
            return f"destination pages {bad} out of range (pool has {self.pool.num_pages})"
        if len(set(dst)) != len(dst):
            return "destination pages named twice"
        return None

    def _discard(self, conn: socket.socket, nbytes: int) -> None:
        scratch = memoryview(bytearray(min(nbytes, 1 << 20) or 1))
        while nbytes > 0:
            n = min(nbytes, len(scratch))
            wire.recv_exact(conn, scratch[:n])
            nbytes -= n

    def _receive_batch(self, conn, h: wire.BatchHeader, stage: torch.Tensor) -> tuple[int, list[int]]:
        written, refused = 0, []
        raw = stage.view(torch.uint8).reshape(-1).numpy()
        for start in range(0, len(h.pages), _STAGE_PAGES):
            chunk = h.pages[start : start + _STAGE_PAGES]
            wire.recv_exact(conn, memoryview(raw)[: len(chunk) * self._page_bytes])
            self._count(bytes_received=len(chunk) * self._page_bytes)
            with self.write_lock:
                allowed = [self._allowed(page, gen, h.request_id) for page, gen in chunk]
                keep = [i for i, ok in enumerate(allowed) if ok]
                refused += [page for (page, _), ok in zip(chunk, allowed) if not ok]
                if keep:  # not through torch: this is the connection's thread (page_copy)
                    copy_pages(stage, keep, self.pool.data, [chunk[i][0] for i in keep])
            written += len(keep)
        self._count(pages_written=written, writes_refused=len(refused))
        return written, refused

    def _allowed(self, page: int, generation: int, request_id: str) -> bool:
        if self._guard is None:
            return True
        try:
            return bool(self._guard(page, generation, request_id))
        except Exception:  # a broken guard fails closed
            log.exception("kv write guard raised for page %d; refusing the write", page)
            return False
