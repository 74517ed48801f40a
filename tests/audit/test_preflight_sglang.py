"""preflight against SGLang response shapes, over real loopback HTTP."""

import json

from bulkhead.cli import main


def run(capsys, *argv):
    code = main(["preflight", "--timeout", "5", *argv])
    return code, capsys.readouterr().out


def run_json(capsys, *urls):
    code, out = run(capsys, "--json", *urls)
    return code, json.loads(out)


def test_incident_pair_is_flagged_and_exits_1(engines, capsys):
    prefill, decode = engines.url("sglang-incident-prefill"), engines.url("sglang-incident-decode")
    code, report = run_json(capsys, prefill, decode)
    assert code == 1
    by_role = {r["role"]: r for r in report["records"]}
    assert by_role["prefill"]["pool_tokens"] == 681_280
    assert by_role["prefill"]["context_length"] == 1_048_576
    assert by_role["prefill"]["max_input_tokens"] == 681_274
    assert by_role["decode"]["max_input_tokens"] == 1_048_570
    assert by_role["prefill"]["model"] == "GLM-5.3" and by_role["prefill"]["engine"] == "sglang"
    checks = {(f["check"], tuple(f["urls"])) for f in report["findings"]}
    assert ("pool_below_context", (prefill,)) in checks
    assert ("input_limit_off_context", (prefill,)) in checks
    assert ("pair_mismatch", (prefill, decode)) in checks
    # decode's own pool holds the context: nothing against it alone.
    assert not [f for f in report["findings"] if f["urls"] == [decode]]
    pair = [f for f in report["findings"] if f["check"] == "pair_mismatch"]
    assert [f["message"] for f in pair] == ["max_input_tokens: prefill 681,274 vs decode 1,048,570"]


def test_incident_table_names_the_numbers(engines, capsys):
    code, out = run(capsys, engines.url("sglang-incident-prefill"), engines.url("sglang-incident-decode"))
    assert code == 1
    assert "KV pool holds 681,280 tokens but the advertised context is 1,048,576: 367,296 tokens short" in out
    assert out.splitlines()[0].split() == ["URL", "ENGINE", "ROLE", "MODEL", "CONTEXT", "MAX", "INPUT", "POOL", "PAGE", "KV", "DTYPE"]


def test_fixed_pair_is_clean_and_exits_0(engines, capsys):
    # The decode side is an older SGLang that only serves /get_server_info.
    code, report = run_json(capsys, engines.url("sglang-fixed-prefill"), engines.url("sglang-fixed-decode-legacy"))
    assert code == 0, report["findings"]
    assert report["findings"] == [] and report["unreadable"] == []
    assert [r["pool_tokens"] for r in report["records"]] == [2_040_000, 1_245_184]
    assert {r["page_size"] for r in report["records"]} == {64}


def test_fixed_pair_table_says_ok(engines, capsys):
    code, out = run(capsys, engines.url("sglang-fixed-prefill"), engines.url("sglang-fixed-decode-legacy"))
    assert code == 0
    assert out.rstrip().splitlines()[-1].startswith("OK:")
