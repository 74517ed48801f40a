"""The lineage writer records a request's adapter (name and digest) on every
page handed to it, from its `adapter` record to its end, and a request story
names it. The deployments' own logs are checked end to end in
test_adapters_disagg.py."""

from bulkhead.lineage import writer
from bulkhead.lineage.query import request_story, records
from bulkhead.lineage.writer import LineageLog

KEY = bytes(range(32))
SQL = {"name": "sql", "digest": "d" * 64}


def test_every_page_handed_to_an_adapter_request_names_the_adapter_until_it_ends(tmp_path):
    log = LineageLog(tmp_path / "l.jsonl", KEY, flush_interval_s=3600, process="test")
    log.adapter("r1", "alpha", "sql", "d" * 64)
    log.allocated("r1", "alpha", [1, 2], [1, 1])
    log.allocated("base", "alpha", [3], [1])  # the base model's request: no adapter
    log.cache_hit("r1", "alpha", [4], [2], ["alpha"])
    log.allocated("r1", "alpha", [5], [1])  # grown mid-decode
    log.request_end("r1", "alpha", "stop")
    log.allocated("r1", "alpha", [6], [1])  # an id reused after the end names nothing old
    log.close()
    handed = [(r["pages"], r.get("adapter")) for r in records(tmp_path / "l.jsonl")
              if r["kind"] in ("alloc", "cache_hit")]
    assert handed == [([1, 2], SQL), ([3], None), ([4], SQL), ([5], SQL), ([6], None)]
    assert request_story([tmp_path / "l.jsonl"], "r1").adapter == SQL
    assert request_story([tmp_path / "l.jsonl"], "base").adapter is None


def test_requests_that_never_end_are_forgotten_oldest_first(tmp_path, monkeypatch):
    monkeypatch.setattr(writer, "MAX_ADAPTER_REQUESTS", 2)
    log = LineageLog(tmp_path / "l.jsonl", KEY, flush_interval_s=3600, process="test")
    for rid in ("a", "b", "c"):  # refused before any engine saw them: no end record
        log.adapter(rid, "alpha", "sql", "d" * 64)
    assert log._adapter_of("a") == {} and log._adapter_of("c") == {"adapter": SQL}
    log.close()
