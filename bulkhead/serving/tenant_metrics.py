"""Prometheus families of each tenant's fair-share state, exported alike by
a colocated server (one scheduler) and the router (summed over the workers'
last heartbeats)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


def tenant_metrics(stats: dict[str, dict]):
    """Fair-share state per tenant (bulkhead.engine.scheduler.Scheduler.tenant_stats).
    Ids and counts only; /metrics needs an operator key when keys are on."""
    service = GaugeMetricFamily("bulkhead_tenant_service", "Fair-queue virtual counter (weighted tokens served)",
                                labels=["tenant"])
    served = CounterMetricFamily("bulkhead_tenant_tokens_served", "Tokens the engine computed for the tenant",
                                 labels=["tenant", "kind"])
    waiting = GaugeMetricFamily("bulkhead_tenant_requests_waiting", "Requests waiting for a slot or pages",
                                labels=["tenant"])
    pages = GaugeMetricFamily("bulkhead_tenant_kv_pages", "KV pages held by running requests, and the quota",
                              labels=["tenant", "kind"])
    preempted = CounterMetricFamily("bulkhead_tenant_quota_preemptions",
                                    "Requests preempted to give pages to another tenant", labels=["tenant"])
    for t, st in stats.items():
        service.add_metric([t], st["service"])
        served.add_metric([t, "prompt"], st["prompt_tokens_served"])
        served.add_metric([t, "output"], st["output_tokens_served"])
        waiting.add_metric([t], st["waiting"])
        pages.add_metric([t, "held"], st["kv_pages"])
        if st["kv_quota"] is not None:
            pages.add_metric([t, "quota"], st["kv_quota"])
        preempted.add_metric([t], st["quota_preemptions"])
    yield from (service, served, waiting, pages, preempted)
