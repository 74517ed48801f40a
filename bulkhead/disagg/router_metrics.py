"""What the router reports about itself and its workers: the `/server_info`
body, why it is not ready (/ready) and the Prometheus collector. Both only read: the worker registry
(each worker's last heartbeat), the router's event counters and the control
plane's drop counts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from bulkhead import __version__
from bulkhead.disagg.registry import state_of
from bulkhead.errors import Overloaded
from bulkhead.lineage import health as lineage_health
from bulkhead.serving.fleet_metrics import FleetFigures, kv_usage
from bulkhead.serving import memory
from bulkhead.serving.memory import rss_bytes
from bulkhead.serving.tenant_metrics import tenant_metrics

if TYPE_CHECKING:
    from bulkhead.disagg.router import DisaggBackend


def router_info(router: DisaggBackend) -> dict:
    workers = router.registry.describe()
    try:
        limits = router.registry.limits()
        advertised = {"context_length": limits.context_length, "max_input_tokens": limits.max_input_tokens,
                      "pool_tokens": limits.pool_tokens, "page_size": limits.page_size}
    except Overloaded:
        advertised = {"context_length": None, "max_input_tokens": None, "pool_tokens": None}
    contexts = {w["context_length"] for w in workers}
    reporting = [w for w in workers if "memory" in w]  # a worker of an older version sends none
    return {
        "engine": "bulkhead", "version": __version__, "role": "router", "model": router.model_id,
        **advertised, "kv_dtype": workers[0]["kv_dtype"] if workers else None,
        "workers": workers, "refused_workers": dict(router.registry.refused),
        "worker_limits_differ": len(contexts) > 1,
        # One worker without its guards (--unsafe-no-guards) is enough to lose isolation.
        "guards": "off" if any(w.get("guards") != "on" for w in workers) else "on",
        "control_plane": vars(router.signer.stats).copy(), "counters": dict(router.counters),
        "auth": router.auth,
        # Each process's RSS (the workers' from their last heartbeat) and pools.
        "memory": memory.section({"router": rss_bytes(), **{w["name"]: w["memory"]["rss_bytes"] for w in reporting}},
                                 {w["name"]: w["memory"]["kv_pool_bytes"] for w in reporting}),
    }


def router_not_ready(router: DisaggBackend) -> list[str]:
    """Why /ready is 503: no prefill/decode pair takes requests (none
    registered, lost, or the last of a role drained: every request would get
    a 503), or a live worker's lineage log cannot be written (as its last
    heartbeat said)."""
    registry, reasons = router.registry, []
    for role in ("prefill", "decode"):
        if not any(w.role == role for w in registry.assignable()):
            others = [f"{w.name} {state_of(w)}" for w in registry.all() if w.role == role]
            reasons.append(f"no prefill/decode pair can serve: no {role} worker takes requests "
                           f"({', '.join(others) or 'none registered'})")
    for w in registry.live():
        if (why := lineage_health.unwritable(w.info.get("lineage"))) is not None:
            reasons.append(f"{w.name}: {why}")
    return reasons


def sum_tenant_stats(per_worker) -> dict[str, dict]:
    """One row per tenant over every worker's scheduler (its tenant_stats):
    counts and pages add up; a KV quota is None where no worker set one."""
    out: dict[str, dict] = {}
    for stats in per_worker:
        for tenant, row in stats.items():
            into = out.setdefault(tenant, {})
            for name, value in row.items():
                if value is None:
                    into.setdefault(name, None)
                else:
                    into[name] = round((into.get(name) or 0) + value, 1)
    return out


def router_fleet_figures(router: DisaggBackend) -> FleetFigures:
    """The router as one model server to a fleet router in front of it.
    running + waiting = the requests routed to a pair and not finished (the
    route table, exact); waiting = those a worker's scheduler still queues
    (its last heartbeat). KV usage is the fuller role's: a request needs
    pages in a prefill and a decode pool, so the tighter one decides; each
    role's pages are summed over its live workers. With no live worker of a
    role there is no page to have: usage 1."""
    with router.lock:
        in_flight = len(router.routes)
    live = [w.info for w in router.registry.live()]
    waiting = sum(row.get("waiting", 0) for info in live for row in info.get("tenants", {}).values())
    usage = 0.0
    for role in ("prefill", "decode"):
        pools = [i for i in live if i.get("role") == role]
        usage = max(usage, kv_usage(sum(i.get("num_pages", 0) for i in pools),
                                    sum(i.get("free_pages", 0) for i in pools),
                                    sum(i.get("cached_pages", 0) for i in pools)))
    decodes = [i for i in live if i.get("role") == "decode"]
    return FleetFigures(waiting=min(waiting, in_flight), running=max(0, in_flight - waiting), kv_usage=usage,
                        page_size=live[0].get("page_size", 0) if live else 0,
                        num_pages=sum(i.get("num_pages", 0) for i in decodes))


class RouterCollector:
    def __init__(self, router: DisaggBackend):
        self.router = router

    def collect(self):
        workers = self.router.registry.all()
        pages = GaugeMetricFamily("bulkhead_kv_pages", "KV pool pages by worker and state", labels=["worker", "state"])
        counters = CounterMetricFamily("bulkhead_worker_events", "Worker event counts", labels=["worker", "event"])
        for w in workers:
            for state in ("free", "owned", "dirty"):
                pages.add_metric([w.name, state], w.info.get(f"{state}_pages", 0))
            for event, n in w.counters.items():
                counters.add_metric([w.name, event], n)
            for event, n in w.control.items():
                counters.add_metric([w.name, f"control_{event}"], n)
        yield pages
        yield counters
        ok = GaugeMetricFamily("bulkhead_lineage_ok", "1 while the worker's lineage log is written and whole, else 0",
                               labels=["worker"])
        for w in workers:
            if w.info.get("lineage"):
                ok.add_metric([w.name], 0 if lineage_health.problem(w.info["lineage"]) else 1)
        yield ok
        router = CounterMetricFamily("bulkhead_router_events", "Router event counts", labels=["event"])
        for event, n in self.router.counters.items():
            router.add_metric([event], n)
        for event, n in vars(self.router.signer.stats).items():
            router.add_metric([f"control_{event}"], n)
        yield router
        failures = sum(w.info.get("engine_failures", 0) for w in workers)
        yield CounterMetricFamily("bulkhead_engine_failures", "Steps failed closed on any worker", failures)
        # The tenant families a colocated server exports, summed over the
        # workers' last heartbeats (operators only, as all of /metrics).
        yield from tenant_metrics(self.router.tenant_stats())
