"""The checks over normalised records, without HTTP."""

import pytest

from bulkhead.audit.findings import check_pairs, check_router, check_worker
from bulkhead.audit.limits import EngineLimits


def worker(**overrides):
    values = dict(
        url="http://w",
        engine="sglang",
        role="prefill",
        model="m",
        context_length=131_072,
        max_input_tokens=131_066,
        pool_tokens=200_000,
        page_size=64,
        kv_dtype="bfloat16",
        input_margin=6,
    )
    values.update(overrides)
    return EngineLimits(**values)


def checks(findings):
    return [f.check for f in findings]


def test_a_pool_that_holds_the_context_is_clean():
    assert check_worker(worker()) == []
    assert check_worker(worker(pool_tokens=131_072)) == []  # exactly enough


def test_a_pool_one_token_short_is_flagged():
    assert checks(check_worker(worker(pool_tokens=131_071))) == ["pool_below_context"]


@pytest.mark.parametrize(("max_input", "flagged"), [(131_066, False), (131_072, False), (131_065, True), (131_073, True)])
def test_input_limit_must_sit_within_the_documented_margin(max_input, flagged):
    assert checks(check_worker(worker(max_input_tokens=max_input))) == (["input_limit_off_context"] if flagged else [])


def test_no_margin_means_no_input_check():
    assert check_worker(worker(engine="vllm", max_input_tokens=None, input_margin=None)) == []


def test_unreported_limits_are_findings_not_passes():
    assert checks(check_worker(worker(pool_tokens=None, context_length=None))) == ["pool_unreported", "context_unreported"]


def test_routers_are_not_held_to_a_pool():
    assert check_worker(worker(role="router", pool_tokens=None)) == []


def test_router_advertising_more_than_a_worker_accepts():
    router = worker(url="http://r", role="router", context_length=262_144)
    assert checks(check_router(router, [worker(behind="http://r")])) == ["router_context_above_worker"]
    assert check_router(worker(url="http://r", role="router"), [worker(behind="http://r")]) == []


def test_every_prefill_decode_pair_is_compared_field_by_field():
    prefill = worker(url="http://p")
    decodes = [worker(url="http://d1", role="decode"), worker(url="http://d2", role="decode", page_size=16, kv_dtype="fp8_e4m3")]
    found = check_pairs([prefill, *decodes])
    assert [(f.urls, f.message) for f in found] == [
        (("http://p", "http://d2"), "page_size: prefill 64 vs decode 16"),
        (("http://p", "http://d2"), "kv_dtype: prefill 'bfloat16' vs decode 'fp8_e4m3'"),
    ]


def test_colocated_workers_are_not_paired():
    assert check_pairs([worker(role="colocated"), worker(role="colocated", page_size=1)]) == []
