"""The lineage commands as the README writes them: the name given to
`serve --lineage-log` finds every worker's log beside it (with its rotated
segments), and `lineage request` takes the X-Request-Id a client sent.
Files only: no engine, no server."""

import json
import re

import pytest

from bulkhead.cli import main
from bulkhead.lineage import chain
from bulkhead.lineage.writer import LineageLog

KEY = bytes(range(32))


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "lineage.key"
    path.write_text(KEY.hex())
    return str(path)


def worker_log(base, worker, **kw):
    return LineageLog(chain.worker_log_path(base, worker), KEY, flush_interval_s=3600, process=worker, **kw)


def test_verify_finds_each_workers_log_and_its_rotated_segments_by_the_serve_name(tmp_path, key_file, capsys):
    base = tmp_path / "lineage.jsonl"
    prefill = worker_log(base, "prefill-0", max_bytes=400)  # rotates every few records
    decode = worker_log(base, "decode-0")
    for i in range(12):
        prefill.allocated(f"r{i}-0-0", "alpha", [i], [1])
        prefill.flush()
        decode.allocated(f"r{i}-0-0", "alpha", [i], [1])
    prefill.close()
    decode.close()
    assert (tmp_path / "lineage.prefill-0.jsonl.1").exists() and not base.exists()
    assert main(["lineage", "verify", "--key", key_file, str(base)]) == 0
    out = capsys.readouterr().out
    assert "lineage.decode-0.jsonl: OK: 14 records in 1 segments" in out
    segments = re.search(r"lineage\.prefill-0\.jsonl: OK: \d+ records in (\d+) segments", out)
    assert segments and int(segments.group(1)) > 1, out  # the rotated ones were found and checked too


def test_who_read_and_request_read_the_workers_logs_by_the_serve_name(tmp_path, key_file, capsys):
    base = tmp_path / "lineage.jsonl"
    decode = worker_log(base, "decode-0")
    decode.allocated("cmpl-a-0-0", "alpha", [3], [1])
    decode.freed("cmpl-a-0-0", [3], [1], ["alpha"])
    decode.allocated("cmpl-b-0-0", "beta", [3], [2])  # not scrubbed in between: beta was handed alpha's KV
    decode.close()
    assert main(["lineage", "who-read", "--tenant", "alpha", "--json", "--key", key_file, str(base)]) == 0
    reads = json.loads(capsys.readouterr().out)
    assert [(r["request"], r["log"]) for r in reads] == [("cmpl-b-0-0", "lineage.decode-0.jsonl")]
    assert main(["lineage", "request", "cmpl-b", "--json", "--key", key_file, str(base)]) == 0
    assert json.loads(capsys.readouterr().out)["tenant"] == "beta"


def test_a_name_with_no_log_and_no_worker_log_is_a_usage_error_naming_both(tmp_path, key_file, capsys):
    assert main(["lineage", "verify", "--key", key_file, str(tmp_path / "lineage.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "no lineage log at" in err and "lineage.prefill-0.jsonl" in err


def test_head_and_rotated_files_are_not_taken_for_workers(tmp_path):
    base = tmp_path / "lineage"  # no suffix: lineage.1 is its own rotated segment, lineage.head its head
    for name in ("lineage", "lineage.1", "lineage.head", "lineage.decode-0", "lineage.decode-0.2",
                 "lineage.decode-0.head", "lineage.decode-0.tmp"):
        (tmp_path / name).write_text("")
    assert chain.logs_named(base) == [base, tmp_path / "lineage.decode-0"]


def _named_log(path, requests):
    log = LineageLog(path, KEY, flush_interval_s=3600, process="colocated")
    for rid, tenant, client_id in requests:
        log.named(f"{rid}-0-0", tenant, client_id)
        log.allocated(f"{rid}-0-0", tenant, [1], [1])
        log.freed(f"{rid}-0-0", [1], [1], [tenant])
        log.request_end(f"{rid}-0-0", tenant, "length")
    log.close()


def test_request_accepts_the_callers_x_request_id(tmp_path, key_file, capsys):
    path = tmp_path / "lineage.jsonl"
    _named_log(path, [("cmpl-aaa", "alpha", "order-17"), ("cmpl-bbb", "beta", "other")])
    assert main(["lineage", "request", "order-17", "--json", "--key", key_file, str(path)]) == 0
    story = json.loads(capsys.readouterr().out)
    assert (story["request"], story["tenant"], story["client_id"]) == ("cmpl-aaa", "alpha", "order-17")
    assert [r["kind"] for r in story["records"]] == ["name", "alloc", "free", "end"]
    assert main(["lineage", "request", "order-17", "--key", key_file, str(path)]) == 0
    assert "request cmpl-aaa (tenant alpha, X-Request-Id order-17)" in capsys.readouterr().out


def test_an_x_request_id_two_tenants_used_is_refused_until_a_tenant_is_named(tmp_path, key_file, capsys):
    path = tmp_path / "lineage.jsonl"
    _named_log(path, [("cmpl-aaa", "alpha", "job-1"), ("cmpl-bbb", "beta", "job-1")])
    assert main(["lineage", "request", "job-1", "--json", "--key", key_file, str(path)]) == 2
    err = capsys.readouterr().err
    assert "names 2 requests" in err and "cmpl-aaa (tenant alpha" in err and "cmpl-bbb (tenant beta" in err
    assert main(["lineage", "request", "job-1", "--tenant", "beta", "--json", "--key", key_file, str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["request"] == "cmpl-bbb"
    assert main(["lineage", "request", "job-2", "--key", key_file, str(path)]) == 2
    assert "no request 'job-2'" in capsys.readouterr().err


def test_a_partial_id_names_no_request(tmp_path, key_file, capsys):
    path = tmp_path / "lineage.jsonl"
    _named_log(path, [("cmpl-aaa", "alpha", "x")])
    assert main(["lineage", "request", "cmpl", "--key", key_file, str(path)]) == 2
