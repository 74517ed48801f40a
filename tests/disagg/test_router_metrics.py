"""The router's Prometheus collector (bulkhead.disagg.router_metrics): the
per-tenant families of a colocated server, summed over the workers."""

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from bulkhead.disagg.router_metrics import RouterCollector, sum_tenant_stats


def _row(service, waiting, pages, quota=None):
    return {"service": service, "prompt_tokens_served": 10, "output_tokens_served": 5, "waiting": waiting,
            "kv_pages": pages, "kv_quota": quota, "quota_preemptions": 0}


def _router(workers):
    return SimpleNamespace(
        registry=SimpleNamespace(all=lambda: workers), counters={"admitted": 3},
        signer=SimpleNamespace(stats=SimpleNamespace(accepted=1)),
        tenant_stats=lambda: sum_tenant_stats(w.info["tenants"] for w in workers))


def test_router_metrics_carry_each_tenants_figures_summed_over_the_workers():
    workers = [SimpleNamespace(name=n, counters={}, control={}, info={"tenants": t, "free_pages": 1})
               for n, t in (("prefill-0", {"alpha": _row(4.0, 1, 3)}),
                            ("decode-0", {"alpha": _row(2.0, 0, 5), "beta": _row(1.0, 2, 0, quota=8)}))]
    registry = CollectorRegistry()
    registry.register(RouterCollector(_router(workers)))
    text = generate_latest(registry).decode()
    assert 'bulkhead_tenant_kv_pages{kind="held",tenant="alpha"} 8.0' in text
    assert 'bulkhead_tenant_requests_waiting{tenant="beta"} 2.0' in text
    assert 'bulkhead_tenant_tokens_served_total{kind="prompt",tenant="alpha"} 20.0' in text
    assert 'bulkhead_tenant_kv_pages{kind="quota",tenant="beta"} 8.0' in text
    assert 'kind="quota",tenant="alpha"' not in text  # no worker set alpha a quota
