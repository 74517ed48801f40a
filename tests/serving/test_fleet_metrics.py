"""The fleet families (bulkhead.serving.fleet_metrics): a fleet router's
names, its meaning of KV usage, and no tenant in any label."""

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bulkhead.serving.fleet_metrics import FleetCollector, FleetFigures, kv_usage

FIGURES = FleetFigures(waiting=3, running=5, kv_usage=0.25, page_size=16, num_pages=400)


def scrape(figures) -> dict[str, list]:
    registry = CollectorRegistry()
    registry.register(FleetCollector(lambda: figures))
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_the_endpoint_pickers_default_names_carry_the_figures():
    families = scrape(FIGURES)
    assert families["vllm:num_requests_waiting"][0].value == 3
    assert families["vllm:num_requests_running"][0].value == 5
    assert families["vllm:kv_cache_usage_perc"][0].value == 0.25
    (cache,) = families["vllm:cache_config_info"]
    assert cache.labels == {"block_size": "16", "num_gpu_blocks": "400"}


def test_lora_info_says_no_adapter_is_served_and_no_label_names_a_tenant():
    families = scrape(FIGURES)
    (lora,) = families["vllm:lora_requests_info"]
    assert lora.labels == {"max_lora": "0", "running_lora_adapters": "", "waiting_lora_adapters": ""}
    assert lora.value > 1e9  # the protocol's value: when it was updated (a Unix time)
    labels = {name for samples in families.values() for s in samples for name in s.labels}
    assert labels == {"max_lora", "running_lora_adapters", "waiting_lora_adapters", "block_size", "num_gpu_blocks"}


def test_a_backend_without_a_pool_exports_no_fleet_family():
    assert scrape(None) == {}


def test_kv_usage_counts_the_prefix_cache_as_free_and_dirty_pages_as_used():
    assert kv_usage(num_pages=100, free=60, cached=30) == 0.1   # 10 pages held by requests or dirty
    assert kv_usage(num_pages=100, free=100, cached=0) == 0.0
    assert kv_usage(num_pages=100, free=0, cached=0) == 1.0
    assert kv_usage(num_pages=0, free=0, cached=0) == 1.0  # no pool: nothing a request could have
