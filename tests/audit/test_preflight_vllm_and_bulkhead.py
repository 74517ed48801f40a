"""preflight against vLLM, llama.cpp and bulkhead response shapes, over real loopback HTTP."""

import json

from bulkhead.cli import main


def run_json(capsys, *argv):
    code = main(["preflight", "--json", "--timeout", "5", *argv])
    return code, json.loads(capsys.readouterr().out)


def test_vllm_limits_come_from_models_and_metrics(engines, capsys):
    code, report = run_json(capsys, engines.url("vllm"))
    assert code == 0, report
    [record] = report["records"]
    assert record["engine"] == "vllm"
    assert record["model"] == "meta-llama/Meta-Llama-3-70B-Instruct"
    assert record["context_length"] == 8192
    assert record["pool_tokens"] == 87_808 * 16  # num_gpu_blocks x block_size
    assert record["page_size"] == 16
    assert record["max_input_tokens"] is None  # vLLM has no separate input limit
    assert record["role"] == "unknown"


def test_role_given_on_the_command_line_fills_what_vllm_cannot_state(engines, capsys):
    code, report = run_json(capsys, "decode=" + engines.url("vllm"))
    assert report["records"][0]["role"] == "decode"
    assert report["records"][0]["url"] == engines.url("vllm")


def test_a_role_that_contradicts_the_engine_is_a_finding(engines, capsys):
    code, report = run_json(capsys, "decode=" + engines.url("sglang-fixed-prefill"))
    assert code == 1
    assert [f["check"] for f in report["findings"]] == ["role_conflict"]
    assert report["records"][0]["role"] == "prefill"  # the engine's word stands


def test_mixed_engine_pair_compares_model_context_page_and_dtype(engines, capsys):
    code, report = run_json(capsys, engines.url("sglang-fixed-prefill"), "decode=" + engines.url("vllm"))
    assert code == 1
    fields = sorted(f["message"].split(":")[0] for f in report["findings"] if f["check"] == "pair_mismatch")
    assert fields == ["context_length", "model", "page_size"]  # kv dtype: auto on both


def test_bulkhead_colocated_is_clean(engines, capsys):
    code, report = run_json(capsys, engines.url("bulkhead-colocated"))
    assert code == 0, report
    [record] = report["records"]
    assert (record["engine"], record["role"], record["pool_tokens"], record["kv_dtype"]) == ("bulkhead", "colocated", 65_536, "bfloat16")


def test_bulkhead_router_reports_each_worker(engines, capsys):
    router = engines.url("bulkhead-router")
    code, report = run_json(capsys, router)
    assert code == 1
    assert [r["role"] for r in report["records"]] == ["router", "prefill", "decode"]
    assert all(r["behind"] == router for r in report["records"][1:])
    prefill_url, decode_url = "http://127.0.0.1:9/prefill-0", "http://127.0.0.1:9/decode-0"
    found = {(f["check"], tuple(f["urls"]), f["message"]) for f in report["findings"]}
    assert ("pool_below_context", (prefill_url,), "KV pool holds 4,096 tokens but the advertised context is 8,192: 4,096 tokens short") in found
    assert ("pair_mismatch", (prefill_url, decode_url), "page_size: prefill 16 vs decode 32") in found
    # "bf16" and "bfloat16" are one dtype, and a router has no pool of its own.
    assert len(found) == 2


def test_api_key_is_sent_as_a_bearer_token(engines, capsys):
    keyed = engines.url("bulkhead-colocated-keyed")
    refused, report = run_json(capsys, keyed)
    assert refused == 2
    assert "--api-key" in report["unreadable"][0]["reason"]
    accepted, report = run_json(capsys, "--api-key", "sk-audit-test", keyed)
    assert accepted == 0, report


def test_the_openai_base_url_with_v1_names_the_engine_above_it(engines, capsys):
    # Issue 16: the URL a user just gave the openai client failed with "no known engine dialect".
    code, report = run_json(capsys, engines.url("vllm") + "/v1/")
    assert code == 0, report
    [record] = report["records"]
    assert record["engine"] == "vllm" and record["url"] == engines.url("vllm")


def test_llamacpp_limits_come_from_props_and_slots(engines, capsys):
    code, report = run_json(capsys, engines.url("llamacpp"))
    assert code == 0, report
    [record] = report["records"]
    assert record["engine"] == "llama.cpp" and record["role"] == "colocated"
    assert record["model"] == "SmolLM2-135M-Instruct-Q4_1.gguf"
    assert record["context_length"] == 4096 and record["pool_tokens"] == 4096  # one slot of -c 8192 --parallel 2


def test_llamacpp_without_slots_is_read_from_props_alone(engines, capsys):
    code, report = run_json(capsys, engines.url("llamacpp-no-slots") + "/v1")
    assert code == 0, report
    [record] = report["records"]
    assert record["engine"] == "llama.cpp" and record["context_length"] == 4096
    assert record["model"] == "SmolLM2-135M-Instruct-Q4_1.gguf"  # from model_path
