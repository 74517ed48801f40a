"""dashboard_view: /server_info's body reshaped into /dashboard's figures,
for one colocated engine and for a router's workers (pure: dicts only)."""

from bulkhead.server.dashboard import dashboard_view, page_html

ENGINE = {"role": "colocated", "model": "m", "guards": "on", "num_pages": 10, "free_pages": 5, "owned_pages": 3,
          "cached_pages": 1, "dirty_pages": 1, "pages_scrubbed_total": 7, "pages_allocated_total": 12,
          "owned_pages_by_tenant": {"alpha": 3, "beta": 1}}
TENANTS = {"live": {"alpha": {"service": 10.0, "waiting": 2, "running": 1}},
           "table": {"alpha": {"weight": 2.0}, "beta": {"weight": 1.0}},
           "throttled": {"beta": {"max_concurrent": 2, "requests_per_minute": 1}}}


def test_a_colocated_engine_is_one_pool_with_its_pages_by_state_and_tenant():
    view = dashboard_view(ENGINE, TENANTS)
    (pool,) = view["pools"]
    assert (pool["num_pages"], pool["free"], pool["owned"], pool["cached"], pool["dirty"]) == (10, 5, 3, 1, 1)
    assert pool["scrubbed_total"] == 7 and pool["by_tenant"] == {"alpha": 3, "beta": 1}
    assert view["transfers_in_flight"] == 0


def test_a_router_shows_each_workers_pool_and_counts_granted_transfers():
    prefill = dict(ENGINE, role="prefill", name="prefill-0", jobs_by_phase={"transferring": 2, "prefilling": 1})
    decode = dict(ENGINE, role="decode", name="decode-0", jobs_by_phase={"decode_allocated": 2, "decoding": 4})
    view = dashboard_view({"role": "router", "model": "m", "workers": [prefill, decode]}, TENANTS)
    assert [p["name"] for p in view["pools"]] == ["prefill-0", "decode-0"]
    assert view["transfers_in_flight"] == 2  # one per granted, not yet committed, transfer
    assert view["pools"][1]["jobs_by_phase"]["decoding"] == 4


def test_tenants_carry_queue_service_weight_and_throttled_requests():
    rows = dashboard_view(ENGINE, TENANTS)["tenants"]
    assert rows["alpha"] == {"service": 10.0, "waiting": 2, "running": 1, "weight": 2.0, "throttled": 0, "adapters": []}
    assert rows["beta"]["throttled"] == 3 and rows["beta"]["weight"] == 1.0


def test_the_page_is_self_contained_and_keeps_the_key_out_of_the_url():
    html = page_html()
    assert "http://" not in html and "https://" not in html and "<link" not in html and "src=" not in html
    assert "sessionStorage" in html and "Authorization" in html and "?key" not in html


def test_the_service_column_names_its_unit():
    html = page_html()
    assert "service (weighted tokens)" in html and "each output token 2" in html


def test_each_tenant_row_names_its_lora_adapters():
    view = dashboard_view({"role": "colocated"}, {"live": {"alpha": {}}, "adapters": {"alpha": ["sql"], "beta": ["x"]}})
    assert view["tenants"]["alpha"]["adapters"] == ["sql"]
    assert view["tenants"]["beta"]["adapters"] == ["x"]  # a tenant with adapters and nothing running yet
    assert "LoRA adapters" in page_html()
