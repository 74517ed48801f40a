"""Dialect edge cases, served through httpx.MockTransport."""

import httpx
import pytest

from bulkhead.audit.preflight import EngineTarget, audit
from bulkhead.audit.prometheus_text import label_sets


def serve(routes):
    def handler(request):
        body = routes.get(request.url.path)
        if body is None:
            return httpx.Response(404)
        if isinstance(body, str):
            return httpx.Response(200, text=body)
        return httpx.Response(200, json=body)

    return httpx.Client(transport=httpx.MockTransport(handler))


def read(routes, spec="http://engine.test"):
    with serve(routes) as client:
        return audit([EngineTarget.parse(spec)], client)


def test_sglang_with_data_parallel_ranks_reports_the_smallest_pool():
    report = read(
        {
            "/server_info": {
                "disaggregation_mode": "null",
                "context_length": None,  # unset on the command line: /v1/models has the effective value
                "max_total_num_tokens": 300_000,
                "max_req_input_len": 131_066,
                "page_size": 1,
                "kv_cache_dtype": "fp8_e5m2",
                "internal_states": [
                    {"memory_usage": {"token_capacity": 300_000}},
                    {"memory_usage": {"token_capacity": 120_000}},
                ],
            },
            "/v1/models": {"data": [{"id": "qwen", "max_model_len": 131_072}]},
        }
    )
    [record] = report.records
    assert (record.role, record.pool_tokens, record.context_length, record.kv_dtype) == ("colocated", 120_000, 131_072, "fp8_e5m2")
    assert [f.check for f in report.findings] == ["pool_below_context"]


def test_sglang_without_models_endpoint_falls_back_to_server_args():
    report = read({"/get_server_info": {"disaggregation_mode": "decode", "context_length": 4096, "max_total_num_tokens": 8192,
                                        "served_model_name": "tiny", "dtype": "bfloat16", "kv_cache_dtype": "auto"}})  # fmt: skip
    [record] = report.records
    assert (record.role, record.model, record.context_length, record.kv_dtype) == ("decode", "tiny", 4096, "bfloat16")


def test_sglang_without_any_context_is_a_finding():
    report = read({"/server_info": {"max_total_num_tokens": 8192, "context_length": None}})
    assert [f.check for f in report.findings] == ["context_unreported"]


def test_vllm_with_data_parallel_engines_reports_the_smallest_pool():
    metrics = (
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0\n'
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="400"} 1.0\n'
    )
    report = read({"/metrics": metrics, "/v1/models": {"data": [{"id": "m", "max_model_len": 8192}]}})
    assert report.records[0].pool_tokens == 6400
    assert [f.check for f in report.findings] == ["pool_below_context"]


def test_vllm_before_the_kv_cache_is_sized_has_no_pool():
    report = read({"/metrics": 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n',
                   "/v1/models": {"data": [{"id": "m", "max_model_len": 8192}]}})  # fmt: skip
    assert [f.check for f in report.findings] == ["pool_unreported"]


def test_prometheus_labels_with_escapes_commas_and_timestamps():
    text = (
        "# HELP vllm:cache_config_info x\n"
        'vllm:cache_config_info{a="1,2",b="say \\"hi\\"",c="back\\\\slash"} 1.0 1700000000\n'
        'vllm:cache_config_info_other{a="x"} 1\n'
        "vllm:cache_config_info 1\n"
    )
    assert label_sets(text, "vllm:cache_config_info") == [{"a": "1,2", "b": 'say "hi"', "c": "back\\slash"}, {}]


@pytest.mark.parametrize(
    ("spec", "url", "role"),
    [
        ("http://h:1", "http://h:1", None),
        ("prefill=http://h:1", "http://h:1", "prefill"),
        ("decode=https://h/x?y=1", "https://h/x?y=1", "decode"),
        ("http://h:1/?a=b", "http://h:1/?a=b", None),
        ("bogus=http://h", "bogus=http://h", None),
        ("router=http://h", "router=http://h", None),  # a router states its own role
    ],
)
def test_target_specs(spec, url, role):
    assert EngineTarget.parse(spec) == EngineTarget(url=url, role_hint=role)


def test_a_malformed_response_is_unreadable_not_a_crash():
    report = read({"/server_info": {"engine": "bulkhead", "role": "router", "workers": 7}})
    assert report.exit_code == 2
    assert "malformed bulkhead response" in report.unreadable[0].reason
