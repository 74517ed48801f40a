"""The tcp backend's framing. One batch per write_pages call:

    prefill -> decode : MAGIC, u32 header length, header JSON, body
        header = {"token", "request_id", "page_bytes", "pages": [[dst_page, dst_generation], ...]}
        body   = len(pages) * page_bytes: page i is the bytes of
                 pool.data[src_pages[i]] (layers, then K and V)
    decode -> prefill : MAGIC, u32 ack length, ack JSON
        ack    = {"written": int, "refused": [dst_page, ...], "error": str | None}

The ack is sent only after every page of the batch has been written or
dropped, so a received ack proves the batch has drained.
"""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass

MAGIC = b"BHK1"
_PREFIX = struct.Struct("!4sI")
MAX_HEADER_BYTES = 16 << 20  # a header lists pages, never KV bytes; anything bigger is garbage


class WireError(Exception):
    """The stream is not speaking this protocol (or ended mid-frame)."""


@dataclass(frozen=True)
class BatchHeader:
    token: str
    request_id: str
    page_bytes: int
    pages: tuple[tuple[int, int], ...]  # (dst_page, dst_generation)


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill view from sock, or raise WireError on EOF."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise WireError(f"peer closed the connection after {got} of {len(view)} bytes")
        got += n


def _recv_json(sock: socket.socket) -> dict:
    prefix = bytearray(_PREFIX.size)
    recv_exact(sock, memoryview(prefix))
    magic, length = _PREFIX.unpack(prefix)
    if magic != MAGIC or length > MAX_HEADER_BYTES:
        raise WireError(f"bad frame prefix {bytes(prefix)!r}")
    body = bytearray(length)
    recv_exact(sock, memoryview(body))
    try:
        return json.loads(body)
    except ValueError as e:
        raise WireError(f"frame is not JSON: {e}") from e


def _send_json(sock: socket.socket, obj: dict) -> None:
    body = json.dumps(obj, separators=(",", ":")).encode()
    sock.sendall(_PREFIX.pack(MAGIC, len(body)) + body)


def send_header(sock: socket.socket, h: BatchHeader) -> None:
    _send_json(sock, {"token": h.token, "request_id": h.request_id, "page_bytes": h.page_bytes,
                      "pages": [list(p) for p in h.pages]})


def recv_header(sock: socket.socket) -> BatchHeader:
    d = _recv_json(sock)
    try:
        pages = tuple((int(p), int(g)) for p, g in d["pages"])
        return BatchHeader(str(d["token"]), str(d["request_id"]), int(d["page_bytes"]), pages)
    except (KeyError, TypeError, ValueError) as e:
        raise WireError(f"malformed batch header: {e!r}") from e


def send_ack(sock: socket.socket, written: int, refused: list[int], error: str | None) -> None:
    _send_json(sock, {"written": written, "refused": refused, "error": error})


def recv_ack(sock: socket.socket) -> dict:
    return _recv_json(sock)
