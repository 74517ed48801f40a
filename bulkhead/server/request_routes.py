"""`GET` and `DELETE /v1/requests/{id}`: read or cancel one of your own requests in flight."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fastapi import FastAPI, Request

from bulkhead.server.inflight import InFlightRequests

# DELETE waits this long for the request to end, so that a 200 usually means
# its pages are already on their way back to the pool; after it, the answer
# says "cancelling" and the request still ends on its own.
CANCEL_WAIT_S = 5.0


def add_request_routes(app: FastAPI, inflight: InFlightRequests, tenant_of: Callable[[Request], str]) -> None:
    @app.get("/v1/requests/{request_id}")
    async def read_request(request_id: str, request: Request):
        return inflight.get(tenant_of(request), request_id).view()

    @app.delete("/v1/requests/{request_id}")
    async def cancel_request(request_id: str, request: Request):
        entry = inflight.get(tenant_of(request), request_id)
        entry.cancelled.set()
        try:
            await asyncio.wait_for(entry.ended.wait(), CANCEL_WAIT_S)
        except asyncio.TimeoutError:
            pass
        return entry.view()
