"""Auth and what the server says about tenants: 401s in the OpenAI shape,
revocation without a restart, and metrics/logs that carry tenant ids and token
counts but never prompt text or keys."""

import os
import time
import uuid

import httpx
import pytest

from tests.conftest import TEST_KEYS
from tests.server.tiny_server import ALPHA, REVOCABLE_KEY, write_keys
from tests.server_process import OPERATOR_HEADERS, OPERATOR_KEY

ENDPOINTS = [("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 1}),
             ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
             ("GET", "/v1/models", None), ("GET", "/v1/requests/cmpl-x", None), ("DELETE", "/v1/requests/cmpl-x", None)]


def call(server, method, path, body, headers):
    return httpx.request(method, server.url + path, json=body, headers=headers, timeout=60)


def assert_401(r, *secrets):
    assert r.status_code == 401, r.text
    err = r.json()["error"]
    assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key" and err["message"]
    for s in secrets:
        assert s not in r.text


@pytest.mark.parametrize("method,path,body", ENDPOINTS, ids=[f"{m} {p}" for m, p, _ in ENDPOINTS])
@pytest.mark.parametrize("header", [None, "", "Bearer", "sk-alpha-test", "Basic sk-alpha-test", "Bearer sk-wrong"])
def test_missing_and_wrong_keys_get_401(tiny_server, method, path, body, header):
    before = tiny_server.info()["pages_allocated_total"]
    headers = {} if header is None else {"Authorization": header}
    assert_401(call(tiny_server, method, path, body, headers))
    assert tiny_server.info()["pages_allocated_total"] == before


def test_a_wrong_key_is_echoed_neither_in_the_error_nor_in_the_log(tiny_server):
    canary_key = f"sk-canary-{uuid.uuid4().hex}"
    assert_401(call(tiny_server, *ENDPOINTS[0], {"Authorization": f"Bearer {canary_key}"}), canary_key)
    assert_401(call(tiny_server, *ENDPOINTS[0], {"Authorization": canary_key}), canary_key)
    log = tiny_server.log()
    assert canary_key not in log
    assert not any(key in log for key in TEST_KEYS)


def test_a_key_removed_from_the_file_is_revoked_while_the_server_runs(tiny_server):
    keys_file = tiny_server.log_path.parent / "keys.toml"
    headers = {"Authorization": f"Bearer {REVOCABLE_KEY}"}
    assert call(tiny_server, "GET", "/v1/models", None, headers).status_code == 200
    write_keys(keys_file, TEST_KEYS)  # gamma's key is gone
    later = time.time_ns() + 2 * 10**9
    os.utime(keys_file, ns=(later, later))  # a new mtime even on a coarse clock
    # The key store stats the file at most once a second: poll, bounded.
    for _ in range(100):
        r = call(tiny_server, "GET", "/v1/models", None, headers)
        if r.status_code != 200:
            break
        time.sleep(0.1)
    assert_401(r, REVOCABLE_KEY)
    assert_401(call(tiny_server, *ENDPOINTS[0], headers))
    assert call(tiny_server, "GET", "/v1/models", None, {"Authorization": f"Bearer {ALPHA}"}).status_code == 200


def test_metrics_and_logs_carry_tenants_and_token_counts_never_prompt_text(tiny_server):
    canary = f"zebra{uuid.uuid4().hex[:12]}quartz"
    prompt_before = tiny_server.metric("bulkhead_tokens_total", tenant="alpha", kind="prompt")
    r = httpx.post(tiny_server.url + "/v1/completions", timeout=60, headers={"Authorization": f"Bearer {ALPHA}"},
                   json={"prompt": f"The password is {canary}. Repeat: {canary}", "max_tokens": 3,
                         "ignore_eos": True, "stop": [canary]})
    assert r.status_code == 200, r.text
    usage, rid = r.json()["usage"], r.json()["id"]
    metrics, log = httpx.get(tiny_server.url + "/metrics", headers=OPERATOR_HEADERS).text, tiny_server.log()
    for haystack in (metrics, log):
        assert canary not in haystack and "password" not in haystack
    # What they do carry: the tenant and the counts.
    assert tiny_server.metric("bulkhead_tokens_total", tenant="alpha", kind="prompt") == (
        prompt_before + usage["prompt_tokens"])
    lines = [line for line in log.splitlines() if rid in line]
    assert any("tenant=alpha" in line and f"prompt_tokens={usage['prompt_tokens']}" in line for line in lines), lines
    assert any(f"completion_tokens={usage['completion_tokens']}" in line for line in lines), lines


# /dashboard/data: the figures the /dashboard page polls (issue 16 item 10).
OPERATOR_ENDPOINTS = ["/metrics", "/server_info", "/dashboard/data"]


@pytest.mark.parametrize("path", OPERATOR_ENDPOINTS)
def test_operator_endpoints_need_an_operator_key_and_a_tenant_key_gets_403(tiny_server, path):
    # Issue 16: /metrics listed every tenant's names and counts to anyone who could reach the port.
    assert_401(call(tiny_server, "GET", path, None, {}))
    assert_401(call(tiny_server, "GET", path, None, {"Authorization": "Bearer sk-wrong"}))
    r = call(tiny_server, "GET", path, None, {"Authorization": f"Bearer {ALPHA}"})
    assert r.status_code == 403, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["code"] == "permission_denied"
    assert "beta" not in r.text
    assert call(tiny_server, "GET", path, None, OPERATOR_HEADERS).status_code == 200


def test_the_dashboard_page_is_open_and_holds_no_figure(tiny_server):
    # The page is code only: what it shows comes from /dashboard/data, which needs the key.
    r = httpx.get(tiny_server.url + "/dashboard")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "/dashboard/data" in r.text and "alpha" not in r.text and "beta" not in r.text
    assert "default-src 'none'" in r.headers["content-security-policy"]


def test_health_stays_open_and_an_operator_key_makes_no_requests(tiny_server):
    assert httpx.get(tiny_server.url + "/health").status_code == 200
    r = call(tiny_server, *ENDPOINTS[0], OPERATOR_HEADERS)
    assert r.status_code == 403 and r.json()["error"]["code"] == "permission_denied", r.text
    assert OPERATOR_KEY not in r.text
