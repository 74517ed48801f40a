"""Prometheus metrics. Labels carry tenant ids and counts, never prompt text."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from bulkhead.lineage import health as lineage_health
from bulkhead.serving.tenant_metrics import tenant_metrics

if TYPE_CHECKING:  # the HTTP layer runs in the router process too, which loads no torch
    from bulkhead.engine.engine import Engine


class EngineCollector:
    """Reads pool and ledger state at scrape time (ints only; no lock needed)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def collect(self):
        ledger, pool = self.engine.ledger, self.engine.pool
        pages = GaugeMetricFamily("bulkhead_kv_pages", "KV pool pages by state", labels=["state"])
        pages.add_metric(["free"], ledger.num_free)
        pages.add_metric(["owned"], ledger.num_owned)
        pages.add_metric(["dirty"], ledger.num_dirty)
        yield pages
        by_tenant = GaugeMetricFamily("bulkhead_kv_pages_owned", "KV pages owned, by tenant", labels=["tenant"])
        for tenant, count in sorted(ledger.owned_by_tenant().items()):
            by_tenant.add_metric([tenant], count)
        yield by_tenant
        yield CounterMetricFamily("bulkhead_kv_pages_scrubbed", "Pages scrubbed after release", pool.pages_scrubbed)
        yield CounterMetricFamily("bulkhead_kv_pages_allocated", "Pages handed out by the ledger",
                                  ledger.pages_allocated)
        sched = self.engine.scheduler
        yield GaugeMetricFamily("bulkhead_requests_running", "Requests holding pages", len(sched.running))
        yield GaugeMetricFamily("bulkhead_requests_waiting", "Admitted requests waiting", len(sched.waiting))
        yield CounterMetricFamily("bulkhead_preemptions", "Requests preempted for pages", sched.num_preemptions)
        yield CounterMetricFamily("bulkhead_engine_failures", "Steps failed closed", self.engine.stats.failures)
        yield from tenant_metrics(sched.tenant_stats())
        for name, (doc, value) in lineage_health.metric_samples(self.engine.lineage.stats()).items():
            yield GaugeMetricFamily(name, doc, value)
        cache = sched.cache
        if cache is not None:
            yield CounterMetricFamily("bulkhead_prefix_cache_hit_pages", "Prompt pages served from the cache",
                                      cache.hits)
            yield CounterMetricFamily("bulkhead_prefix_cache_miss_pages", "Prompt pages computed", cache.misses)


class KeyStoreCollector:
    """Whether keys.toml on disk has mistakes, and whether it is stale (unreadable: the last good keys serve)."""

    def __init__(self, keys):
        self.keys = keys  # bulkhead.server.auth.KeyStore

    def collect(self):
        yield GaugeMetricFamily("bulkhead_keys_file_valid",
                                "1 while the keys file on disk has no mistake; 0 while it has one",
                                0 if self.keys.reload_error else 1)
        yield GaugeMetricFamily("bulkhead_keys_stale",
                                "1 while the keys file on disk cannot be read and the last good keys authorise: "
                                "keys removed from it are NOT revoked", 1 if self.keys.stale else 0)
        yield CounterMetricFamily("bulkhead_keys_reload_failures",
                                  "Keys file reloads with a mistake (applied closed) or unreadable (not applied)",
                                  self.keys.reload_failures)


class Metrics:
    def __init__(self, collector):
        """collector: the backend's own prometheus collector (pool, workers)."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("bulkhead_requests", "HTTP requests answered", ["tenant", "endpoint", "status"],
                                registry=r)
        # Every HTTP response, refusals included (401, 404, 409, 413, 429, malformed JSON, unsupported
        # parameters); reason = the error's code; tenant only where the key was valid (response_counter.py).
        self.responses = Counter("bulkhead_http_responses", "HTTP responses by status and reason",
                                 ["tenant", "endpoint", "status", "reason"], registry=r)
        self.tokens = Counter("bulkhead_tokens", "Tokens processed", ["tenant", "kind"], registry=r)
        self.rejections = Counter("bulkhead_rejections", "Requests refused before admission", ["tenant", "reason"],
                                  registry=r)
        self.throttled = Counter("bulkhead_throttled_requests", "Requests refused with a 429 over a tenant limit",
                                 ["tenant", "limit"], registry=r)
        # No tenant label: per-tenant TTFT on an open endpoint would show one
        # tenant another's cache behaviour (the CVE-2025-46570 class).
        self.ttft = Histogram("bulkhead_time_to_first_token_seconds", "Time to first token", registry=r,
                              buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
        r.register(collector)
