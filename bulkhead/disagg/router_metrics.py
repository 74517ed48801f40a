"""What the router reports about itself and its workers: the `/server_info`
body and the Prometheus collector. Both only read: the worker registry
(each worker's last heartbeat), the router's event counters and the control
plane's drop counts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from bulkhead import __version__
from bulkhead.errors import Overloaded
from bulkhead.lineage import health as lineage_health
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
