"""The whole server's figures, every tenant named or measured: an operator's.

    GET /server_info     every live limit and setting, and each tenant's share
    GET /metrics         every Prometheus family, the fleet families included
    GET /metrics/fleet   the fleet families alone (bulkhead.serving.fleet_metrics):
                         a few lines, cheap at an endpoint picker's 50 ms refresh

With keys on, an operator key only (no key 401, a tenant's key 403): even
the fleet families, which name no tenant, move with every tenant's load.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from bulkhead.serving.fleet_metrics import FleetCollector

if TYPE_CHECKING:
    from bulkhead.server.app import ServerState


def add_operator_routes(app: FastAPI, state: ServerState, operator_only: Callable[[Request], None]) -> None:
    fleet = FleetCollector(state.backend.fleet_figures)
    state.metrics.registry.register(fleet)  # /metrics: beside the bulkhead_* families
    fleet_only = CollectorRegistry()
    fleet_only.register(fleet)

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

    @app.get("/metrics/fleet")
    async def fleet_metrics(request: Request):
        operator_only(request)
        return Response(generate_latest(fleet_only), media_type=CONTENT_TYPE_LATEST)
