"""/metrics/fleet on a real server: the names a fleet router scrapes, with
the engine's live figures while a request decodes and after it ends, no
tenant in any label, and only for an operator when keys are on."""

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.test_requests_by_id import LONG, auth
from tests.server.tiny_server import ALPHA, BETA
from tests.server_process import OPERATOR_HEADERS

pytestmark = pytest.mark.e2e
FLEET = {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
         "vllm:lora_requests_info", "vllm:cache_config_info"}


def scrape(server, path="/metrics/fleet") -> dict[str, list]:
    r = httpx.get(server.url + path, headers=OPERATOR_HEADERS, timeout=10)
    assert r.status_code == 200, r.text
    return {f.name: f.samples for f in text_string_to_metric_families(r.text) if f.name in FLEET}


def value(families, name) -> float:
    (sample,) = families[name]
    return sample.value


def scrape_until(server, check, tries: int = 200) -> dict[str, list]:
    """Scrape until check(families) holds (bounded): the engine does not wait
    for the client, so on a loaded machine a request may be far along before
    the client reads anything."""
    for _ in range(tries):
        families = scrape(server)
        if check(families):
            return families
    raise AssertionError(f"the fleet figures never showed it: {families}")


def test_the_fleet_figures_follow_a_running_request_and_name_no_tenant(tiny_server):
    with httpx.stream("POST", tiny_server.url + "/v1/completions", json={**LONG, "stream": True},
                      headers=auth(ALPHA), timeout=120) as r:
        assert r.status_code == 200  # admitted: alpha's request is queued or running from here on
        during = scrape_until(tiny_server, lambda f: value(f, "vllm:num_requests_running") == 1)
        info = tiny_server.info()
    assert set(during) == FLEET
    assert value(during, "vllm:num_requests_waiting") == 0
    assert 0 < value(during, "vllm:kv_cache_usage_perc") <= 1  # the request's pages
    (cache,) = during["vllm:cache_config_info"]
    assert cache.labels == {"block_size": str(info["page_size"]), "num_gpu_blocks": str(info["num_pages"])}
    labels = {k: v for samples in during.values() for s in samples for k, v in s.labels.items()}
    assert not {"tenant", "alpha", "beta"} & (set(labels) | set(labels.values()))

    tiny_server.wait_idle()  # every page back (the prefix cache's count as free)
    after = scrape(tiny_server)
    assert value(after, "vllm:num_requests_running") == 0 and value(after, "vllm:kv_cache_usage_perc") == 0
    assert set(scrape(tiny_server, "/metrics")) == FLEET  # Prometheus finds them beside bulkhead_*


def test_with_keys_on_only_an_operator_reads_them(tiny_server):
    url = tiny_server.url + "/metrics/fleet"
    assert httpx.get(url, timeout=10).status_code == 401
    assert httpx.get(url, headers=auth(BETA), timeout=10).status_code == 403
    assert httpx.get(url, headers=OPERATOR_HEADERS, timeout=10).status_code == 200
