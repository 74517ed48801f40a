"""Refuse request bodies over a size limit without holding them in memory:
a declared Content-Length over it is a 413 before a byte is read; a chunked
body is counted as it arrives and cut off at the limit, the 413 replacing
whatever the app would have answered to the truncated body.
"""

from __future__ import annotations

import json

from bulkhead.errors import BodyTooLarge


class _CutOff(Exception):
    """Raised into the app's body read when the limit is crossed."""


class BodyLimit:
    """Pure ASGI middleware (BaseHTTPMiddleware cannot see the body as it streams)."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send, f"request body of {int(declared)} bytes", int(declared))
        received, cut_off, started = 0, False, False

        async def counted_receive():
            nonlocal received, cut_off
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    cut_off = True
                    raise _CutOff()
            return message

        async def guarded_send(message):
            nonlocal started
            if cut_off:
                return  # the app answered a body it never saw whole; the 413 replaces it
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except _CutOff:
            pass
        if cut_off and not started:
            await self._refuse(send, f"request body of at least {received} bytes", received)

    async def _refuse(self, send, what: str, size: int) -> None:
        err = BodyTooLarge(f"{what} exceeds the limit of {self.max_bytes}", limit=self.max_bytes, value=size)
        body = json.dumps(err.to_dict()).encode()
        await send({"type": "http.response.start", "status": err.status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
