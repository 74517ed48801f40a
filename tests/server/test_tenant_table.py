"""The tenant table in keys.toml and the per-tenant limits: no server."""

import os
import time

import pytest

from bulkhead.errors import RateLimited
from bulkhead.server.auth import KeyStore
from bulkhead.server.inflight import InFlight, InFlightRequests
from bulkhead.server.limiter import TenantLimiter
from bulkhead.server.tenants import DEFAULT_POLICY, TenantPolicy, TenantTableError

KEYS = '[keys]\n"sk-a" = "alpha"\n"sk-b" = "beta"\n'


def store(tmp_path, tenants: str) -> KeyStore:
    f = tmp_path / "keys.toml"
    f.write_text(KEYS + tenants)
    return KeyStore(f)


def test_a_plain_keys_file_still_works_and_every_tenant_gets_the_defaults(tmp_path):
    s = store(tmp_path, "")
    assert s.tenant_for("Bearer sk-a") == "alpha"
    assert s.policy("alpha") == DEFAULT_POLICY and s.policies == {}


def test_the_tenant_table_is_read(tmp_path):
    s = store(tmp_path, "\n[tenants.alpha]\nweight = 2\nmax_concurrent = 4\nrequests_per_minute = 60\n"
                        "tokens_per_minute = 1e5\nmax_queued = 0\nkv_share = 0.25\n")
    assert s.policy("alpha") == TenantPolicy(weight=2.0, max_concurrent=4, requests_per_minute=60.0,
                                             tokens_per_minute=1e5, max_queued=0, kv_share=0.25)
    assert s.policy("beta") == DEFAULT_POLICY


@pytest.mark.parametrize("table, message", [
    ("[tenants.gamma]\nweight = 1\n", r"keys.toml:5: \[tenants.gamma\]: no API key names tenant 'gamma'"),
    ("[tenants.alpha]\nweight = 0\n", r"keys.toml:6: \[tenants.alpha\] weight: must be > 0, got 0"),
    ("[tenants.alpha]\nmax_concurrent = 2\nweight = -1\n", r"keys.toml:7: \[tenants.alpha\] weight: must be > 0"),
    ('[tenants.alpha]\nrequests_per_minute = "ten"\n', r"keys.toml:6: .*requests_per_minute: must be a number"),
    ("[tenants.alpha]\nmax_concurrent = 1.5\n", r"keys.toml:6: .*max_concurrent: must be a whole number"),
    ("[tenants.alpha]\nwieght = 2\n", r"keys.toml:6: .*wieght: unknown field"),
    ("[tenants.alpha]\nkv_share = 0.7\n[tenants.beta]\nkv_share = 0.6\n", r"add up to 1.3"),
    ("[tenants]\nalpha = 3\n", r"\[tenants.alpha\]: expected a table"),
])
def test_mistakes_name_the_entry_and_the_line(tmp_path, table, message):
    with pytest.raises(TenantTableError, match=message):
        store(tmp_path, "\n" + table)


def test_a_reload_with_a_mistake_keeps_the_last_good_table_and_says_why(tmp_path):
    s = store(tmp_path, "[tenants.alpha]\nweight = 3\n")
    f = tmp_path / "keys.toml"
    f.write_text(KEYS + '[tenants.alpha]\nweight = "heavy"\n')
    later = time.time_ns() + 2 * 10**9
    os.utime(f, ns=(later, later))
    s._checked = 0.0  # skip the once-a-second stat throttle
    assert s.tenant_for("Bearer sk-a") == "alpha"  # never raised to the request
    assert s.policy("alpha").weight == 3.0
    assert "weight: must be a number" in s.reload_error
    f.write_text(KEYS + "[tenants.alpha]\nweight = 5\n")
    os.utime(f, ns=(later + 10**9, later + 10**9))
    s._checked = 0.0
    s.maybe_reload()
    assert s.policy("alpha").weight == 5.0 and s.reload_error is None


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def limiter(**policy):
    inflight, clock = InFlightRequests(), Clock()
    return TenantLimiter(lambda t: TenantPolicy(**policy) if t == "alpha" else DEFAULT_POLICY, inflight, clock), \
        inflight, clock


def test_requests_per_minute_refuses_with_429_and_retry_after_then_refills():
    lim, _, clock = limiter(requests_per_minute=2)
    lim.check("alpha", 10)
    lim.check("alpha", 10)
    with pytest.raises(RateLimited) as e:
        lim.check("alpha", 10)
    err = e.value
    assert err.status == 429 and err.code == "rate_limit_exceeded" and err.param == "requests_per_minute"
    assert err.limit == 2 and err.headers == {"Retry-After": "30"}
    body = err.to_dict()["error"]
    assert body["code"] == "rate_limit_exceeded" and "requests_per_minute = 2" in body["message"]
    lim.check("beta", 10)  # another tenant is not affected
    clock.now += 30
    lim.check("alpha", 10)
    assert lim.throttled == {("alpha", "requests_per_minute"): 1}


def test_tokens_per_minute_counts_what_a_request_asks_for_and_a_refusal_takes_nothing():
    lim, _, clock = limiter(tokens_per_minute=600, requests_per_minute=100)
    lim.check("alpha", 500)
    with pytest.raises(RateLimited) as e:
        lim.check("alpha", 200)
    assert e.value.param == "tokens_per_minute" and e.value.type == "tokens" and e.value.value == 200
    assert e.value.retry_after == 10  # 100 tokens short at 10 a second
    assert lim._requests["alpha"].level == 99  # the refused request took nothing from the other bucket
    clock.now += 10
    lim.check("alpha", 200)


def test_a_request_bigger_than_the_bucket_waits_for_a_full_one_instead_of_forever():
    lim, _, clock = limiter(tokens_per_minute=100)
    lim.check("alpha", 250)
    with pytest.raises(RateLimited):
        lim.check("alpha", 250)
    clock.now += 210  # back from -150 to a full 100
    lim.check("alpha", 250)


def test_concurrency_and_queue_depth_come_from_the_requests_in_flight():
    lim, inflight, _ = limiter(max_concurrent=2, max_queued=1)
    first = InFlight("r1", "alpha", "completions", 1, 5, False)
    inflight.add(first)
    with pytest.raises(RateLimited) as e:  # r1 has no token yet: the queue is full
        lim.check("alpha", 1)
    assert e.value.param == "max_queued"
    first.completion_tokens = 1
    lim.check("alpha", 1)
    inflight.add(InFlight("r2", "alpha", "completions", 1, 5, False))
    with pytest.raises(RateLimited) as e:
        lim.check("alpha", 1)
    assert e.value.param == "max_concurrent" and e.value.value == 3
    inflight.remove(first)
    inflight.get("alpha", "r2").completion_tokens = 1
    lim.check("alpha", 1)
