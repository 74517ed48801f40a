"""Engines that cannot be read make preflight exit 2, whatever else it found."""

import json

import httpx

from bulkhead.cli import main
from bulkhead.audit.preflight import EngineTarget, audit
from tests.audit.fake_engines import closed_loopback_port


def run_json(capsys, *argv):
    code = main(["preflight", "--json", "--timeout", "5", *argv])
    return code, json.loads(capsys.readouterr().out)


def test_unreachable_url_exits_2(capsys):
    url = f"http://127.0.0.1:{closed_loopback_port()}"
    code, report = run_json(capsys, url)
    assert code == 2
    assert report["unreadable"][0]["url"] == url
    assert "cannot connect" in report["unreadable"][0]["reason"]


def test_unreachable_outranks_findings(engines, capsys):
    dead = f"http://127.0.0.1:{closed_loopback_port()}"
    code, report = run_json(capsys, engines.url("sglang-incident-prefill"), dead)
    assert code == 2
    assert report["findings"]  # the reachable engine's findings are still reported


def test_unreachable_table_names_the_url(capsys):
    url = f"http://127.0.0.1:{closed_loopback_port()}"
    code = main(["preflight", "--timeout", "5", url])
    captured = capsys.readouterr()
    assert code == 2
    assert f"UNREADABLE  {url}" in captured.out
    assert "exit 2" in captured.err


def test_a_server_that_speaks_no_known_dialect_is_unreadable(engines, capsys):
    code, report = run_json(capsys, engines.url("not-an-engine"))
    assert code == 2
    assert "no known engine dialect" in report["unreadable"][0]["reason"]


def test_timeouts_are_unreadable_not_crashes():
    def hang(request):
        raise httpx.ReadTimeout("slow", request=request)

    with httpx.Client(transport=httpx.MockTransport(hang)) as client:
        report = audit([EngineTarget.parse("http://engine.invalid")], client)
    assert report.exit_code == 2
    assert "timed out" in report.unreadable[0].reason


def test_server_errors_are_unreadable():
    with httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(500))) as client:
        report = audit([EngineTarget.parse("http://engine.invalid")], client)
    assert report.exit_code == 2
    assert "HTTP 500" in report.unreadable[0].reason
