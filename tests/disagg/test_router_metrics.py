"""The router's Prometheus collector (bulkhead.disagg.router_metrics): the
per-tenant families of a colocated server, summed over the workers."""

import threading
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from bulkhead.disagg.router_metrics import RouterCollector, router_fleet_figures, sum_tenant_stats


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


def _pool(role, num_pages, free, cached=0, waiting=0):
    return SimpleNamespace(info={"role": role, "num_pages": num_pages, "free_pages": free, "cached_pages": cached,
                                 "page_size": 16, "tenants": {"alpha": {"waiting": waiting}}})


def _fleet_router(workers, routes):
    return SimpleNamespace(lock=threading.RLock(), routes=dict.fromkeys(range(routes)),
                           registry=SimpleNamespace(live=lambda: workers))


def test_the_router_reports_its_routes_as_running_or_waiting_and_the_fuller_roles_kv_usage():
    workers = [_pool("prefill", 100, 90, waiting=2), _pool("decode", 100, 20, cached=10, waiting=1),
               _pool("decode", 100, 50)]
    f = router_fleet_figures(_fleet_router(workers, routes=7))
    assert (f.waiting, f.running) == (3, 4)  # 7 routed: 3 queued in a worker's scheduler
    assert f.kv_usage == 0.6  # decode: 200 pages, 70 free or cached; prefill only 0.1 used
    assert (f.page_size, f.num_pages) == (16, 200)


def test_a_router_with_no_decode_worker_is_full():
    f = router_fleet_figures(_fleet_router([_pool("prefill", 100, 100)], routes=0))
    assert f.kv_usage == 1.0 and (f.waiting, f.running) == (0, 0)
