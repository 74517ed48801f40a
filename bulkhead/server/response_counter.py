"""Count every HTTP response by status and reason, refusals included.

A refusal can happen before any route runs (BodyLimit's 413, an unknown
path, malformed JSON), so the count is taken here, outermost, from what is
sent: the status, and an error body's `code` as the reason. The tenant
label is set only where a route accepted the key (the app's tenant_of puts
it in `scope["state"]`): a refused key must not become a way to enumerate
tenants. The endpoint is the route's template, never the raw path, so a
client cannot grow the label set.
"""

from __future__ import annotations

import json

from prometheus_client import Counter

# Error bodies are a few hundred bytes; an error body is read up to here for its code.
MAX_ERROR_BODY = 64 * 1024
UNMATCHED = "unmatched"  # no route: an unknown path, or refused before routing


class ResponseCounter:
    """Pure ASGI middleware (it sees BodyLimit's own 413s, which never reach a route)."""

    def __init__(self, app, counter: Counter):
        self.app = app
        self.counter = counter  # labels: tenant, endpoint, status, reason

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status, body = 0, bytearray()

        async def counting_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status >= 400 and len(body) < MAX_ERROR_BODY:
                body.extend(message.get("body", b"")[: MAX_ERROR_BODY - len(body)])
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        except BaseException:
            self._count(scope, status or 500, "unhandled" if not status else _reason(status, body))
            raise
        self._count(scope, status, _reason(status, body))

    def _count(self, scope, status: int, reason: str) -> None:
        route = scope.get("route")
        endpoint = getattr(route, "path", None) or UNMATCHED
        tenant = (scope.get("state") or {}).get("tenant", "")
        self.counter.labels(tenant, endpoint, str(status), reason).inc()


def _reason(status: int, body: bytes) -> str:
    if status < 400:
        return "ok"
    try:
        code = json.loads(bytes(body))["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    return code if isinstance(code, str) and code.isidentifier() else f"http_{status}"
