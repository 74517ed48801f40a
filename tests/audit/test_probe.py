"""`bulkhead probe` against a fake endpoint that leaks, and the same fake well-behaved."""

from __future__ import annotations

import json

import pytest

from bulkhead.cli import main
from tests.audit.fake_engines import LoopbackServer, closed_loopback_port
from tests.audit.fake_openai import CONTEXT, KEYS, keys_toml, make_fake_openai


@pytest.fixture(scope="module")
def leaky():
    with LoopbackServer(make_fake_openai(leaky=True)) as server:
        yield server.base


@pytest.fixture(scope="module")
def clean():
    with LoopbackServer(make_fake_openai(leaky=False)) as server:
        yield server.base


@pytest.fixture
def keys(tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text(keys_toml())
    return str(path)


def probe_json(capsys, *argv: str) -> tuple[int, dict]:
    code = main(["probe", *argv, "--json", "--concurrency", "3", "--max-tokens", "8", "--timeout", "30"])
    return code, json.loads(capsys.readouterr().out)


def test_leaky_endpoint_is_caught(leaky, keys, capsys):
    code, report = probe_json(capsys, leaky, "--keys", keys, "--skip-coherence")
    assert code == 1 and report["exit_code"] == 1
    hits = [f for f in report["findings"] if f["check"] == "cross_tenant"]
    assert hits and report["cross_tenant_hits"] == len(hits)
    for hit in hits:
        receiver, owner = hit["tenants"]
        assert receiver != owner and {receiver, owner} <= set(KEYS.values())
        assert hit["canary"].startswith("ZQ-") and hit["canary"] in hit["message"]
    over = [f for f in report["findings"] if f["check"] == "over_length"]
    assert len(over) == 2 and all("HTTP 200" in f["message"] for f in over)
    assert report["context_length"] == CONTEXT and report["context_source"] == "/v1/models max_model_len"


def test_leaky_endpoint_table_names_tenants_not_text(leaky, keys, capsys):
    code = main(["probe", leaky, "--keys", keys, "--concurrency", "2", "--max-tokens", "8", "--skip-coherence"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FINDING  cross_tenant" in out and "FINDING  over_length" in out
    assert "Answer " not in out  # response text is never printed


def test_clean_endpoint_passes(clean, keys, capsys):
    code, report = probe_json(capsys, clean, "--keys", keys, "--max-context", "300")
    assert report["findings"] == [] and code == 0
    statuses = {c["check"]: c["status"] for c in report["checks"]}
    assert statuses == {"cross_tenant": "ok", "differential": "ok", "over_length": "ok",
                        "coherence": "ok", "aborts": "ok", "structured": "skipped",  # the fake serves no chat
                        "adapter_names": "skipped", "adapter_timing": "skipped"}  # nor lists an adapter
    assert report["cross_tenant_hits"] == 0


def test_a_structured_answer_that_does_not_parse_is_caught():
    from bulkhead.audit.probe import _shaped
    from bulkhead.audit.probe_client import Reply

    schema_body, tool_body = {"response_format": {}}, {"tools": []}
    assert _shaped(schema_body, Reply(200, text='{"reference":"ZQ-1"}'))
    assert not _shaped(schema_body, Reply(200, text='{"reference":'))
    assert not _shaped(schema_body, Reply(200, text='{"other":"x"}'))
    assert _shaped(tool_body, Reply(200, tool_arguments=('{"reference":"x"}',)))
    assert not _shaped(tool_body, Reply(200, text="I would call record_reference"))  # no call at all


def test_clean_endpoint_table(clean, keys, capsys):
    code = main(["probe", clean + "/v1", "--keys", keys, "--concurrency", "2", "--skip-coherence"])
    out = capsys.readouterr().out
    assert code == 0 and out.rstrip().endswith("no divergence")
    assert "coherence" in out and "SKIPPED" in out


@pytest.fixture(scope="module")
def forgetful():
    with LoopbackServer(make_fake_openai(leaky=False, recall=False)) as server:
        yield server.base


def test_coherence_failure_is_a_finding_and_skippable(forgetful, keys, capsys):
    code, report = probe_json(capsys, forgetful, "--keys", keys)
    assert code == 1
    assert [f["check"] for f in report["findings"]] == ["coherence"]
    assert report["findings"][0]["message"].startswith("coherence: failed")
    code, report = probe_json(capsys, forgetful, "--keys", keys, "--skip-coherence")
    assert code == 0 and report["findings"] == []


def test_one_tenant_skips_cross_tenant_with_a_warning(clean, tmp_path, capsys):
    path = tmp_path / "one.toml"
    path.write_text(keys_toml({"sk-probe-alpha": "alpha"}))
    code, report = probe_json(capsys, clean, "--keys", str(path), "--skip-coherence")
    assert code == 0
    assert any("cross-tenant check skipped" in w for w in report["warnings"])
    assert {c["check"]: c["status"] for c in report["checks"]}["cross_tenant"] == "skipped"


def test_unreachable_endpoint_exits_2(keys, capsys):
    code = main(["probe", f"http://127.0.0.1:{closed_loopback_port()}", "--keys", keys, "--timeout", "5"])
    assert code == 2 and "cannot connect" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["not toml [", "[other]\nx = 1\n", '[keys]\n"k" = 3\n'])
def test_bad_keys_file_exits_2(clean, tmp_path, content, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(content)
    assert main(["probe", clean, "--keys", str(path)]) == 2
    assert "keys file" in capsys.readouterr().err


def test_refused_key_exits_2(clean, tmp_path, capsys):
    path = tmp_path / "wrong.toml"
    path.write_text(keys_toml({"sk-wrong": "alpha", "sk-wrong-2": "beta"}))
    assert main(["probe", clean, "--keys", str(path)]) == 2
    assert "401" in capsys.readouterr().err


def test_help_has_an_example(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["probe", "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0 and "example" in out and "bulkhead probe" in out and "exit codes" in out


@pytest.mark.parametrize("generation, status, finding", [("clamp", "clamps", False), ("overrun", "findings", True)])
def test_generation_clamped_at_the_context_is_reported_as_clamps_not_a_finding(keys, capsys, generation, status,
                                                                             finding):
    # vLLM answers prompt + max_tokens over the context with a 200 that stops at the context: safe (issue 16).
    with LoopbackServer(make_fake_openai(leaky=False, generation=generation)) as server:
        code, report = probe_json(capsys, server.base, "--keys", keys, "--skip-coherence")
    check = next(c for c in report["checks"] if c["check"] == "over_length")
    assert check["status"] == status, report
    over = [f for f in report["findings"] if f["check"] == "over_length"]
    assert bool(over) is finding and code == (1 if finding else 0), report
    if not finding:
        assert f"total_tokens {CONTEXT}" in check["detail"] and "clamped" in check["detail"]
