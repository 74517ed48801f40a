"""`GET /server_info` and `GET /metrics`: the whole server's figures, every tenant named.

With keys on, an operator key only (a tenant's key gets a 403): both name
every tenant and measure its load.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

if TYPE_CHECKING:
    from bulkhead.server.app import ServerState


def add_operator_routes(app: FastAPI, state: ServerState, operator_only: Callable[[Request], None]) -> None:
    @app.get("/server_info")
    async def info(request: Request):
        operator_only(request)
        body = state.backend.info()
        body["tenants"] = state.tenants_info()
        if state.adapters is not None:
            body["adapters"] = state.adapters.info()
        if body["tenants"].get("keys_stale"):
            body["warnings"] = ["keys file unreadable: revocations written in it are NOT in force ("
                                + body["tenants"]["reload_error"] + ")"]
        if extra := state.seams.counters():  # a test harness's own counts (never in production)
            body["harness_counters"] = extra
        return body

    @app.get("/metrics")
    async def prom(request: Request):
        operator_only(request)
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
