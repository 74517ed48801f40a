"""`/dashboard`: a live picture of the pool for operators (docs/dashboard.md
says why the page is open and `/dashboard/data`, its figures, an operator's).

`dashboard_view` reshapes /server_info's figures; it is pure (dicts in,
dict out) so both deployments share it: a colocated engine is one pool, a
router reports each worker's pool from its last heartbeat.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse

from bulkhead.server.dashboard_history import DashboardHistory, FirstTokenTimes

# A decode job in this phase holds granted pages that prefill's KV is being
# written into: one transfer in flight (prefill's side of it is "transferring").
TRANSFER_PHASE = "decode_allocated"


def dashboard_view(info: dict, tenants: dict) -> dict:
    """The page's figures from a /server_info body and its `tenants` part."""
    engines = info.get("workers") if info.get("role") == "router" else [dict(info, name="colocated")]
    pools = [_pool(e) for e in engines or []]
    return {
        "time": time.time(),
        "role": info.get("role"),
        "model": info.get("model"),
        "guards": info.get("guards"),
        "pools": pools,
        "transfers_in_flight": sum(p["jobs_by_phase"].get(TRANSFER_PHASE, 0) for p in pools),
        "tenants": _tenants(tenants),
    }


def _pool(e: dict) -> dict:
    return {
        "name": e.get("name"), "role": e.get("role"), "state": e.get("state", "live"),
        "num_pages": e.get("num_pages", 0), "free": e.get("free_pages", 0), "owned": e.get("owned_pages", 0),
        "cached": e.get("cached_pages", 0), "dirty": e.get("dirty_pages", 0),
        "scrubbed_total": e.get("pages_scrubbed_total", 0), "allocated_total": e.get("pages_allocated_total", 0),
        "by_tenant": e.get("owned_pages_by_tenant", {}), "jobs_by_phase": e.get("jobs_by_phase", {}),
        "scrub_mode": e.get("scrub_mode"), "engine_failures": e.get("engine_failures", 0),
    }


def _tenants(tenants: dict) -> dict[str, dict]:
    """One row per tenant: queue and service (summed over workers on a
    router), its table's weight, and its throttled requests."""
    live, table, throttled = tenants.get("live", {}), tenants.get("table", {}), tenants.get("throttled", {})
    adapters = tenants.get("adapters", {})
    rows = {}
    for t in sorted(set(live) | set(table) | set(throttled) | set(adapters)):
        row = dict(live.get(t, {}))
        row["weight"] = table.get(t, {}).get("weight", 1.0)
        row["throttled"] = sum(throttled.get(t, {}).values())
        row["adapters"] = adapters.get(t, [])  # the tenant's LoRA adapters by name (the page is an operator's)
        rows[t] = row
    return rows


def page_html() -> str:
    return resources.files("bulkhead.server").joinpath("static/dashboard.html").read_text(encoding="utf-8")


def add_dashboard_routes(app: FastAPI, figures: Callable[[], dict],
                         operator_only: Callable[[Request], None], first_tokens: FirstTokenTimes) -> None:
    """figures: dashboard_view's body; first_tokens: the request handlers' times to first token."""
    html = page_html()  # read once: the package's file does not change while serving
    history = DashboardHistory(figures, first_tokens)
    _sample_while_serving(app, history)

    @app.get("/dashboard", response_class=HTMLResponse)
    async def dashboard():
        # no-store: the page is code; a cached old copy would poll with old code.
        # The CSP keeps it to this origin: it loads nothing and sends nothing elsewhere.
        return HTMLResponse(html, headers={
            "Cache-Control": "no-store",
            "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
                                       "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
            "X-Frame-Options": "DENY",
        })

    @app.get("/dashboard/data")
    async def dashboard_data(request: Request, since: float = 0.0):
        operator_only(request)
        return figures() | {"history": history.since(since), "history_period_s": history.period_s,
                            "history_span_s": history.span_s}


def _sample_while_serving(app: FastAPI, history: DashboardHistory) -> None:
    """Run the sampler from the server's start (before any page is open) to
    its shutdown, around whatever lifespan the app already has."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a):
        task = asyncio.create_task(history.run())
        try:
            async with inner(a) as state:
                yield state
        finally:
            task.cancel()

    app.router.lifespan_context = lifespan
