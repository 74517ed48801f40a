"""Requests in flight, addressable by id only by the tenant that sent them.

`GET /v1/requests/{id}` reads one, `DELETE` cancels it (add_request_routes).
The registry is keyed by (tenant, id): another tenant's id is not found
exactly as an unknown one is, so a tenant cannot even learn that another's
request exists. Engine request ids stay server-made and unique; the public
id (a client's X-Request-Id, else the response id) is only a name within
its tenant.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import FastAPI, Request

from bulkhead.errors import Conflict, InvalidRequest, NotFound, RequestCancelled

# A client-chosen id is echoed in responses and logs: keep it short and plain.
CLIENT_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
# DELETE waits this long for the request to end, so that a 200 usually means
# its pages are already on their way back to the pool; after it, the answer
# says "cancelling" and the request still ends on its own.
CANCEL_WAIT_S = 5.0


def client_request_id(header: str | None) -> str | None:
    if header is None:
        return None
    if not CLIENT_ID.fullmatch(header):
        raise InvalidRequest("X-Request-Id must be 1 to 64 characters of A-Z a-z 0-9 . _ : -",
                             param="X-Request-Id", code="invalid_request_id", limit=64, value=len(header))
    return header


@dataclass
class InFlight:
    request_id: str
    tenant: str
    endpoint: str
    choices: int
    prompt_tokens: int
    stream: bool
    created: int = field(default_factory=lambda: int(time.time()))
    completion_tokens: int = 0
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)  # set by DELETE
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # set by the run, however it ended
    outcome: str | None = None  # "finished", "cancelled", "failed" or "disconnected" once ended

    def end(self, outcome: str) -> None:
        if self.outcome is None:
            self.outcome = outcome
        self.ended.set()

    @property
    def state(self) -> str:
        if self.outcome is not None:
            return self.outcome
        if self.cancelled.is_set():
            return "cancelling"
        return "running" if self.completion_tokens else "queued"

    def view(self) -> dict:
        # Ids and counts only: never prompt or output text.
        return {"id": self.request_id, "object": "request", "created": self.created, "endpoint": self.endpoint,
                "state": self.state, "stream": self.stream, "n": self.choices,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}


class InFlightRequests:
    def __init__(self):
        self._entries: dict[tuple[str, str], InFlight] = {}

    def add(self, entry: InFlight) -> None:
        key = (entry.tenant, entry.request_id)
        if key in self._entries:
            raise Conflict(f"a request with id {entry.request_id!r} is already in flight", param="X-Request-Id",
                           code="duplicate_request_id")
        self._entries[key] = entry

    def remove(self, entry: InFlight) -> None:
        if self._entries.get((entry.tenant, entry.request_id)) is entry:
            del self._entries[(entry.tenant, entry.request_id)]

    def get(self, tenant: str, request_id: str) -> InFlight:
        entry = self._entries.get((tenant, request_id))
        if entry is None:  # unknown, finished, or another tenant's: one answer for all three
            raise NotFound(f"no request {request_id!r} is in flight", param="request_id", code="request_not_found")
        return entry

    def count(self, tenant: str, queued: bool = False) -> int:
        """Requests of `tenant` in flight (queued: only those with no token yet)."""
        return sum(1 for (t, _), e in self._entries.items()
                   if t == tenant and (not queued or e.state == "queued"))

    def __len__(self) -> int:
        return len(self._entries)


async def until_cancelled(updates: AsyncIterator, cancelled: asyncio.Event) -> AsyncIterator:
    """Yield from `updates` until it ends; raise RequestCancelled once `cancelled` is set.
    Leaving early in any way closes `updates`, whose cleanup aborts the engine's requests."""
    waiter = asyncio.ensure_future(cancelled.wait())
    step = None
    try:
        while True:
            step = asyncio.ensure_future(anext(updates))
            await asyncio.wait({step, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                raise RequestCancelled("the request was cancelled by its owner")
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        waiter.cancel()
        if step is not None and not step.done():
            step.cancel()  # raises CancelledError inside `updates`, which runs its cleanup
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await step
        await updates.aclose()


def add_request_routes(app: FastAPI, inflight: InFlightRequests, tenant_of: Callable[[Request], str]) -> None:
    @app.get("/v1/requests/{request_id}")
    async def read_request(request_id: str, request: Request):
        return inflight.get(tenant_of(request), request_id).view()

    @app.delete("/v1/requests/{request_id}")
    async def cancel_request(request_id: str, request: Request):
        entry = inflight.get(tenant_of(request), request_id)
        entry.cancelled.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(entry.ended.wait(), CANCEL_WAIT_S)
        return entry.view()
