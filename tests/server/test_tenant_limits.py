"""The tenant table through a real `bulkhead serve` over a tiny random model."""

import os
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import TEST_KEYS
from tests.server.tiny_server import ALPHA, BETA, REVOCABLE_KEY, start_tiny_server, stop_checked

TABLE = "\n[tenants.alpha]\nweight = 2\n\n[tenants.beta]\nrequests_per_minute = 2\nmax_concurrent = 4\n"


def keys_text(table: str) -> str:
    return "[keys]\n" + "".join(f'"{k}" = "{t}"\n' for k, t in TEST_KEYS.items()) + table


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory, long_tiny_model_dir):
    workdir = tmp_path_factory.mktemp("limited-server")
    proc = start_tiny_server(workdir, long_tiny_model_dir)
    keys = workdir / "keys.toml"
    keys.write_text(keys_text(TABLE))  # the helper wrote plain keys; the table arrives as a reload
    touch(keys, 2)
    for _ in range(100):  # the key store stats the file at most once a second: poll, bounded
        if proc.info()["tenants"]["table"]:
            break
        time.sleep(0.1)
    yield proc
    stop_checked(proc)


def touch(path, ahead_s):
    later = time.time_ns() + ahead_s * 10**9
    os.utime(path, ns=(later, later))  # a new mtime even on a coarse clock


def complete(server, key, max_tokens=4):
    return httpx.post(server.url + "/v1/completions", timeout=60, headers={"Authorization": f"Bearer {key}"},
                      json={"prompt": "hello there", "max_tokens": max_tokens, "temperature": 0})


def test_over_a_limit_is_a_429_with_retry_after_and_allocates_nothing(limited_server):
    s = limited_server
    assert s.info()["tenants"]["table"] == {"alpha": {"weight": 2.0},
                                            "beta": {"weight": 1.0, "requests_per_minute": 2.0, "max_concurrent": 4}}
    assert complete(s, BETA).status_code == 200
    assert complete(s, BETA).status_code == 200
    s.wait_idle()
    before = s.info()["pages_allocated_total"]
    r = complete(s, BETA)
    assert r.status_code == 429
    assert int(r.headers["retry-after"]) >= 1
    err = r.json()["error"]
    assert err["code"] == "rate_limit_exceeded" and err["param"] == "requests_per_minute" and err["limit"] == 2
    assert "requests_per_minute = 2" in err["message"]
    assert s.info()["pages_allocated_total"] == before  # refused before the engine saw it
    assert complete(s, ALPHA).status_code == 200  # another tenant is not throttled
    info = s.info()["tenants"]
    assert info["throttled"] == {"beta": {"requests_per_minute": 1}}
    assert s.metric("bulkhead_throttled_requests_total", tenant="beta", limit="requests_per_minute") == 1
    assert s.metric("bulkhead_http_responses_total", tenant="beta", status="429", reason="rate_limit_exceeded") == 1
    assert info["live"]["alpha"]["output_tokens_served"] >= 4 and info["live"]["beta"]["prompt_tokens_served"] > 0
    assert s.metric("bulkhead_tenant_service", tenant="beta") > 0


def test_a_reload_with_a_mistake_keeps_the_last_good_table_and_shows_why(limited_server):
    s = limited_server
    keys = s.log_path.parent / "keys.toml"
    keys.write_text(keys_text(TABLE.replace("weight = 2", "weight = 0")))
    touch(keys, 4)
    for _ in range(100):
        info = s.info()["tenants"]
        if info["reload_error"]:
            break
        time.sleep(0.1)
    assert "weight: must be > 0, got 0" in info["reload_error"] and "keys.toml:6" in info["reload_error"]
    assert info["table"]["alpha"] == {"weight": 2.0}  # the last good table
    assert complete(s, ALPHA).status_code == 200  # never a 500
    assert "reloaded with mistakes" in s.log()
    keys.write_text(keys_text(TABLE))
    touch(keys, 6)
    for _ in range(100):
        if s.info()["tenants"]["reload_error"] is None:
            break
        time.sleep(0.1)
    assert s.info()["tenants"]["reload_error"] is None


def wait_for(check, tries=100):
    for _ in range(tries):  # the key store stats the file at most once a second: poll, bounded
        if check():
            return True
        time.sleep(0.1)
    return False


def test_a_key_removed_beside_a_tenant_table_it_leaves_behind_is_revoked_over_http(limited_server):
    """Issue 34's defect through the server: gamma's key goes, [tenants.gamma] stays."""
    s = limited_server
    keys = s.log_path.parent / "keys.toml"
    gamma = {"Authorization": f"Bearer {REVOCABLE_KEY}"}
    keys.write_text(keys_text(TABLE).replace("[keys]\n", f'[keys]\n"{REVOCABLE_KEY}" = "gamma"\n')
                    + "\n[tenants.gamma]\nweight = 1\n")
    touch(keys, 8)
    assert wait_for(lambda: "gamma" in s.info()["tenants"]["table"])
    assert httpx.get(s.url + "/v1/models", headers=gamma, timeout=60).status_code == 200
    keys.write_text(keys_text(TABLE) + "\n[tenants.gamma]\nweight = 1\n")  # the key line deleted, not the table
    touch(keys, 10)
    assert wait_for(lambda: httpx.get(s.url + "/v1/models", headers=gamma, timeout=60).status_code == 401)
    info = s.info()
    assert "no API key names tenant 'gamma'" in info["tenants"]["reload_error"] and not info["tenants"]["keys_stale"]
    assert complete(s, ALPHA).status_code == 200
    keys.write_text("[keys\n")  # unreadable: the last good keys stay, and everyone is told
    touch(keys, 12)
    assert wait_for(lambda: s.info()["tenants"]["keys_stale"])
    assert "NOT in force" in s.info()["warnings"][0] and s.metric("bulkhead_keys_stale") == 1
    assert "REVOCATIONS IN THIS FILE ARE NOT IN FORCE" in s.log()
    keys.write_text(keys_text(TABLE))
    touch(keys, 14)
    assert wait_for(lambda: s.info()["tenants"]["reload_error"] is None)
    assert s.metric("bulkhead_keys_stale") == 0 and "warnings" not in s.info()


def test_serve_refuses_to_start_on_a_mistake_in_the_tenant_table(tmp_path, long_tiny_model_dir):
    keys = tmp_path / "keys.toml"
    keys.write_text(keys_text("\n[tenants.gamma]\nweight = 1\n"))
    proc = subprocess.run([sys.executable, "-m", "bulkhead.cli", "serve", "--role", "colocated", "--model",
                           str(long_tiny_model_dir), "--api-keys", str(keys), "--port", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "keys.toml:5: [tenants.gamma]: no API key names tenant 'gamma'" in proc.stderr + proc.stdout
