"""The figures a fleet router reads to pick a bulkhead server, under the
names its model-server protocol documents.

The Kubernetes Gateway API Inference Extension's endpoint picker (EPP), and
llm-d's scheduler built on it, scrape each model server's Prometheus text
and read vLLM's names by default (the EPP's `--*-metric` flags):

    TotalQueuedRequests    vllm:num_requests_waiting   gauge
    TotalRunningRequests   vllm:num_requests_running   gauge
    KVCacheUtilization     vllm:kv_cache_usage_perc    gauge, 0..1
    LoRA adapters          vllm:lora_requests_info     gauge (labels; value: a timestamp)
    cache config           vllm:cache_config_info      gauge (labels block_size, num_gpu_blocks)

bulkhead's adapters are tenant-private (two tenants may each have an `sql`),
so routing by adapter name would treat them as one: the LoRA family
advertises none (the EPP skips a series with both lists empty; leaving the
family out would make it log "metric family not found" every scrape). No
family has a tenant label, but the whole server's load moves with every
tenant's requests, so they sit behind the operator key like the rest of
/metrics (bulkhead/server/operator_routes.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
LORA_INFO = "vllm:lora_requests_info"
CACHE_INFO = "vllm:cache_config_info"


@dataclass(frozen=True)
class FleetFigures:
    waiting: int      # requests admitted and queued, not yet given pages to run
    running: int      # requests being served (prefilling, transferring or decoding)
    kv_usage: float   # 0..1: the fraction of KV pages that a new request cannot have
    page_size: int    # tokens per KV page (the EPP's block_size)
    num_pages: int    # pages in the pool that kv_usage is a fraction of (the EPP's num_gpu_blocks)


def kv_usage(num_pages: int, free: int, cached: int) -> float:
    """The fraction of a pool in use. Pages held by the prefix cache count as
    free (it gives them back when a request needs them), as vLLM counts its
    cache's unreferenced blocks; dirty pages (released, not yet scrubbed)
    count as used: nothing can have them yet. A pool of no page is full."""
    if num_pages <= 0:
        return 1.0
    return min(1.0, max(0.0, (num_pages - free - cached) / num_pages))


def fleet_families(f: FleetFigures, now: Callable[[], float] = time.time) -> Iterable[GaugeMetricFamily]:
    yield GaugeMetricFamily(WAITING, "Requests queued, not yet running (all tenants together)", f.waiting)
    yield GaugeMetricFamily(RUNNING, "Requests being served (all tenants together)", f.running)
    yield GaugeMetricFamily(KV_USAGE, "KV cache usage, 0..1: pages a new request cannot have", f.kv_usage)
    lora = GaugeMetricFamily(LORA_INFO, "LoRA adapters: tenant-private, none advertised",
                             labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"])
    lora.add_metric(["0", "", ""], now())  # the protocol's value is the time of the update
    yield lora
    cache = GaugeMetricFamily(CACHE_INFO, "KV cache configuration", labels=["block_size", "num_gpu_blocks"])
    cache.add_metric([str(f.page_size), str(f.num_pages)], 1.0)
    yield cache


class FleetCollector:
    """The fleet families, read from the live engine or router at scrape time.
    figures() returns None where the backend has no pool to report."""

    def __init__(self, figures: Callable[[], FleetFigures | None]):
        self.figures = figures

    def collect(self):
        f = self.figures()
        if f is not None:
            yield from fleet_families(f)
