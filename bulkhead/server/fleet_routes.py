"""The fleet families (bulkhead.serving.fleet_metrics) on two paths:

    GET /metrics         with every other family, for Prometheus
    GET /metrics/fleet   those families alone: a few lines, cheap to build at
                         the endpoint picker's default refresh (every 50 ms),
                         and naming no tenant

Both are an operator's: with keys on, no key 401, a tenant's key 403. The
whole server's queue and KV usage move with every tenant's requests, so a
tenant who could read them would watch the others' load.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from bulkhead.serving.fleet_metrics import FleetCollector, FleetFigures


def add_fleet_routes(app: FastAPI, metrics_registry: CollectorRegistry,
                     figures: Callable[[], FleetFigures | None], operator_only: Callable[[Request], None]) -> None:
    collector = FleetCollector(figures)
    metrics_registry.register(collector)  # /metrics: beside the bulkhead_* families
    fleet_only = CollectorRegistry()
    fleet_only.register(collector)

    @app.get("/metrics/fleet")
    async def fleet_metrics(request: Request):
        operator_only(request)
        return Response(generate_latest(fleet_only), media_type=CONTENT_TYPE_LATEST)
