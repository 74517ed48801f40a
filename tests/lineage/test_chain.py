"""The lineage log's chain: every record linked to the one before under the
lineage key; verify finds a changed, removed, reordered or cut-off record and
says where. Files only: no engine."""

import json
import os

import pytest

from bulkhead.lineage import chain
from bulkhead.lineage.cli import run as cli_run
from bulkhead.lineage.verify import EXIT_FOREIGN, EXIT_GAP, EXIT_OK, EXIT_TAMPERED, verify
from bulkhead.lineage.writer import LineageLog, LineageLogError

KEY = bytes(range(32))


def write_log(path, n=6, key=KEY, **kw):
    log = LineageLog(path, key, flush_interval_s=3600, process="test", **kw)
    for i in range(n):
        log.allocated(f"r{i}", "alpha", [i], [1])
    log.close()
    return path


def lines(path):
    return path.read_bytes().splitlines(keepends=True)


def rewrite(path, new_lines):
    path.write_bytes(b"".join(new_lines))


def test_a_whole_log_verifies(tmp_path):
    path = write_log(tmp_path / "l.jsonl")
    report = verify(path, KEY)
    assert report.exit_code == EXIT_OK, report.problems
    assert report.records == 8  # open, 6 allocs, close
    kinds = [json.loads(ln)["kind"] for ln in lines(path)]
    assert kinds == ["open"] + ["alloc"] * 6 + ["close"]


def test_a_record_that_is_not_chained_is_detected(tmp_path):
    path = write_log(tmp_path / "l.jsonl")
    ls = lines(path)
    rec = json.loads(ls[3])
    rec["prev"] = "0" * 64  # a well-formed record appended with a link it cannot know
    ls[3] = json.dumps(rec, separators=(",", ":")).encode() + b"\n"
    rewrite(path, ls)
    report = verify(path, KEY)
    assert report.exit_code == EXIT_TAMPERED
    # Its own link is wrong and its MAC changed: two links break, and the
    # first cannot tell record 2 changed from record 3's link changed.
    assert report.problems == [
        "record 2 (l.jsonl:3), or the link to it that record 3 (l.jsonl:4) carries, was changed: the chain breaks "
        "between them",
        "record 3 (l.jsonl:4) was changed: the link the next record carries to it does not match"]


@pytest.mark.parametrize("line_number", [2, 3, 5, 7])
def test_a_changed_line_is_named_not_the_line_after_it(tmp_path, line_number):
    path = write_log(tmp_path / "l.jsonl")  # line 1 open, 2..7 allocs, 8 close
    ls = lines(path)
    edited = ls[line_number - 1].replace(b'"tenant":"alpha"', b'"tenant":"gamma"')
    assert edited != ls[line_number - 1]
    ls[line_number - 1] = edited
    rewrite(path, ls)
    report = verify(path, KEY)
    assert report.exit_code == EXIT_TAMPERED
    seq = line_number - 1  # record 0 is on line 1
    assert report.problems == [f"record {seq} (l.jsonl:{line_number}) was changed: the link the next record "
                               f"carries to it does not match"]


def test_a_changed_last_record_is_named_by_the_head_file(tmp_path):
    path = write_log(tmp_path / "l.jsonl")
    ls = lines(path)
    ls[-1] = ls[-1].replace(b'"kind":"close"', b'"kind":"clos3"')
    rewrite(path, ls)
    report = verify(path, KEY)
    assert any(p.startswith("record 7 (l.jsonl:8) is not the record the head file names") for p in report.problems)
    assert not any("l.jsonl:7" in p for p in report.problems), report.problems


def test_a_removed_record_is_located(tmp_path):
    path = write_log(tmp_path / "l.jsonl")
    ls = lines(path)
    del ls[4]
    rewrite(path, ls)
    report = verify(path, KEY)
    assert report.exit_code == EXIT_TAMPERED
    assert "record 4 missing (removed, or a segment deleted)" in report.problems


def test_reordered_records_are_located(tmp_path):
    path = write_log(tmp_path / "l.jsonl")
    ls = lines(path)
    ls[3], ls[4] = ls[4], ls[3]
    rewrite(path, ls)
    report = verify(path, KEY)
    assert report.exit_code == EXIT_TAMPERED
    assert any("record 3 is out of order at l.jsonl:5" in p for p in report.problems), report.problems
    assert not any("missing" in p for p in report.problems)


def test_a_truncated_log_is_detected_by_its_head(tmp_path):
    path = write_log(tmp_path / "l.jsonl")
    ls = lines(path)
    rewrite(path, ls[:5])  # whole lines off the end: the chain alone cannot tell
    report = verify(path, KEY)
    assert report.exit_code == EXIT_TAMPERED
    assert any("the log ends at record 4 but the head file says record 7" in p for p in report.problems)


def test_a_torn_last_line_is_detected(tmp_path):
    path = write_log(tmp_path / "l.jsonl")
    data = path.read_bytes()
    path.write_bytes(data[:-20])
    report = verify(path, KEY)
    assert report.exit_code == EXIT_TAMPERED
    assert any("partial record" in p for p in report.problems)


def test_a_removed_head_file_is_a_problem(tmp_path):
    path = write_log(tmp_path / "l.jsonl")
    chain.head_path(path).unlink()
    assert verify(path, KEY).exit_code == EXIT_TAMPERED


def test_another_key_or_a_foreign_file_is_foreign(tmp_path):
    path = write_log(tmp_path / "l.jsonl")
    assert verify(path, bytes(32)).exit_code == EXIT_FOREIGN
    other = tmp_path / "other.jsonl"
    other.write_text('{"hello": "world"}\n')
    assert verify(other, KEY).exit_code == EXIT_FOREIGN


def test_rotation_continues_the_chain_across_files(tmp_path):
    path = tmp_path / "l.jsonl"
    log = LineageLog(path, KEY, flush_interval_s=3600, max_bytes=400)
    for i in range(20):
        log.allocated(f"r{i}", "alpha", [i], [1])
        log.flush()
    log.close()
    segs = chain.segments(path)
    assert len(segs) > 3 and segs[-1] == path
    report = verify(path, KEY)
    assert report.exit_code == EXIT_OK, report.problems
    assert report.records == 22 + len(segs) - 1  # open, 20 allocs, close, a rotate per new segment
    assert json.loads(lines(segs[1])[0])["kind"] == "rotate"
    segs[1].unlink()  # a whole segment removed from the middle
    report = verify(path, KEY)
    assert report.exit_code == EXIT_TAMPERED
    assert any("missing" in p for p in report.problems)


def test_a_restart_continues_the_chain(tmp_path):
    path = write_log(tmp_path / "l.jsonl", n=2)
    write_log(path, n=2)
    assert [p.name for p in chain.segments(path)] == ["l.jsonl.1", "l.jsonl"]
    report = verify(path, KEY)
    assert report.exit_code == EXIT_OK and report.records == 8, report.problems
    with pytest.raises(LineageLogError, match="not written under this key"):
        LineageLog(path, bytes(32), flush_interval_s=3600)


def test_a_log_that_cannot_be_written_is_loud_and_leaves_no_silent_gap(tmp_path, monkeypatch):
    path = tmp_path / "l.jsonl"
    log = LineageLog(path, KEY, flush_interval_s=3600, max_buffer_bytes=300)
    log.flush()
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(28, "No space left")))
    log.allocated("r1", "alpha", [1], [1])
    log.flush()
    assert log.stats()["error"] and log.stats()["write_errors"] == 1 and log.records_lost == 0
    for i in range(2, 8):  # past max_buffer_bytes: records are dropped, and counted
        log.allocated(f"r{i}", "alpha", [i], [1])
        log.flush()
    assert log.records_lost > 0
    monkeypatch.setattr(os, "write", real_write)
    log.allocated("r9", "alpha", [9], [1])
    log.flush()
    log.close()
    assert log.stats()["error"] is None
    report = verify(path, KEY)
    assert report.exit_code == EXIT_GAP, report.problems
    gaps = [json.loads(ln) for ln in lines(path) if b'"gap"' in ln]
    assert gaps and gaps[0]["lost"] == log.records_lost


def test_cli_verify_exit_codes(tmp_path, capsys):
    from bulkhead.cli import build_parser

    path = write_log(tmp_path / "l.jsonl")
    keyfile = tmp_path / "k"
    keyfile.write_text(KEY.hex())
    parse = build_parser().parse_args
    assert cli_run(parse(["lineage", "verify", "--key", str(keyfile), str(path)])) == EXIT_OK
    ls = lines(path)
    del ls[2]
    rewrite(path, ls)
    assert cli_run(parse(["lineage", "verify", "--key", str(keyfile), str(path)])) == EXIT_TAMPERED
    assert "record 2 missing" in capsys.readouterr().out
    assert cli_run(parse(["lineage", "verify", "--key", str(tmp_path / "nokey"), str(path)])) == 2
    assert cli_run(parse(["lineage", "who-read", "--tenant", "alpha", "--key", str(keyfile), str(path)])) == \
        EXIT_TAMPERED  # refuses to answer from a broken log


def test_who_read_refuses_a_broken_log_beside_one_with_a_gap(tmp_path, capsys):
    """The worst log decides, by severity, not by exit code: a gap (4) is
    milder than a broken chain (1), so a broken log beside a gap still refuses."""
    from bulkhead.cli import build_parser

    gap = tmp_path / "gap.jsonl"
    log = LineageLog(gap, KEY, flush_interval_s=3600)
    log._lost = 2  # two records the writer could not write: the next flush records the gap
    log.flush()
    log.close()
    assert verify(gap, KEY).exit_code == EXIT_GAP
    broken = write_log(tmp_path / "broken.jsonl")
    rewrite(broken, [ln for i, ln in enumerate(lines(broken)) if i != 2])
    keyfile = tmp_path / "k"
    keyfile.write_text(KEY.hex())
    args = build_parser().parse_args(["lineage", "who-read", "--tenant", "alpha", "--key", str(keyfile),
                                      str(gap), str(broken)])
    assert cli_run(args) == EXIT_TAMPERED
    assert "refusing to answer" in capsys.readouterr().err
