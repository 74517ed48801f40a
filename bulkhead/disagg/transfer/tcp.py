"""The tcp backend: prefill streams page bytes to decode's receiver thread.

Decode's receiver (tcp_receiver.Target) runs the write guard on every page.
The source (here) sends one batch per call and waits for its ack; the ack
proves the batch drained. Without an ack (timeout, reset, peer gone) the
source cannot prove it, says so with TransferError(drained=False), and the
receiver's guard is what stops a late page from landing in a reused page.
"""

from __future__ import annotations

import socket

from bulkhead.disagg.transfer import tcp_framing as wire
from bulkhead.disagg.transfer.base import TransferError, TransferSource
from bulkhead.disagg.transfer.page_copy import gather_pages
from bulkhead.disagg.transfer.tcp_receiver import Target

_CONNECT_TIMEOUT_S = 5.0
_SEND_PAGES = 32  # pages gathered per send: bounds prefill's staging copy (~24 MB for SmolLM2 fp32)


class Source(TransferSource):
    name = "tcp"

    def __init__(self, timeout_s: float = 30.0):
        """timeout_s: the longest any one send or the ack may stall before the
        call fails: a dead or wedged decode becomes a TransferError, not a hang."""
        super().__init__()
        self.timeout_s = timeout_s
        # One connection per receiver instance: (host, port, token). A decode
        # restarted on the same port has a new token, so its writers connect
        # again rather than write into the old process's dead socket.
        self._conns: dict[tuple[str, int, str], socket.socket] = {}
        self._stats["refused"] = 0

    def _connect(self, addr: tuple[str, int, str]) -> socket.socket:
        conn = self._conns.get(addr)
        if conn is None:
            for stale in [a for a in self._conns if a[:2] == addr[:2]]:  # an earlier process on that port
                self._drop(stale)
            try:
                conn = socket.create_connection(addr[:2], timeout=_CONNECT_TIMEOUT_S)
            except OSError as e:
                raise TransferError(f"cannot reach decode's receiver at {addr[0]}:{addr[1]}: {e}", drained=True) from e
            conn.settimeout(self.timeout_s)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._conns[addr] = conn
        return conn

    def _drop(self, addr: tuple[str, int, str]) -> None:
        conn = self._conns.pop(addr, None)
        if conn is not None:
            conn.close()

    def _write(self, descriptor, request_id, src, src_pages, dst_pages, dst_generations) -> None:
        addr = (descriptor["host"], int(descriptor["port"]), descriptor["token"])
        conn = self._connect(addr)
        page_bytes = src.data[0].numel() * src.data.element_size()
        header = wire.BatchHeader(descriptor["token"], request_id, page_bytes,
                                  tuple(zip(map(int, dst_pages), map(int, dst_generations))))
        try:
            wire.send_header(conn, header)
            for start in range(0, len(src_pages), _SEND_PAGES):
                conn.sendall(gather_pages(src.data, src_pages[start : start + _SEND_PAGES]))  # not through torch (page_copy)
            ack = wire.recv_ack(conn)
        except (OSError, wire.WireError) as e:  # socket.timeout is an OSError
            self._drop(addr)  # the stream's framing is unknown now
            raise TransferError(
                f"tcp transfer of {len(dst_pages)} pages for {request_id} to {addr[0]}:{addr[1]} failed: {e!r}",
                drained=False,
            ) from e
        if ack.get("error"):
            self._drop(addr)
            raise TransferError(f"decode rejected the batch for {request_id}: {ack['error']}", drained=True)
        refused = tuple(ack.get("refused", ()))
        self._stats["bytes_sent"] += len(dst_pages) * page_bytes
        self._stats["pages_sent"] += int(ack.get("written", 0))
        if refused:
            self._stats["refused"] += len(refused)
            raise TransferError(
                f"decode's write guard refused pages {list(refused)} for {request_id} "
                f"(stale generation or not owned by this request)",
                drained=True, refused_pages=refused,
            )

    def close(self) -> None:
        with self._lock:
            for addr in list(self._conns):
                self._drop(addr)


__all__ = ["Source", "Target"]
