"""`bulkhead lineage verify`: walk a log's chain and say where it breaks.

Exit codes (EXIT_*): 0 the chain is whole; 1 a record was changed, removed,
reordered or cut off the end (each problem names the record's seq and its
file:line); 2 no log or no key; 3 not a lineage log under this key (a
foreign file, or another key); 4 the chain is whole but the writer recorded
a gap (records it could not write).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bulkhead.lineage import chain

RECENT = 4096  # links are checked within this many records of each other

EXIT_OK, EXIT_TAMPERED, EXIT_USAGE, EXIT_FOREIGN, EXIT_GAP = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class Line:
    where: str  # file:line
    raw: bytes
    record: dict | None  # None: not JSON, or not a record


@dataclass
class Report:
    records: int = 0
    segments: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    foreign: str | None = None
    lost: int = 0

    @property
    def exit_code(self) -> int:
        if self.foreign:
            return EXIT_FOREIGN
        if self.problems:
            return EXIT_TAMPERED
        return EXIT_GAP if self.lost else EXIT_OK


def read_lines(path: Path) -> Iterator[tuple[Path, Line | bytes]]:
    """Every line of every segment, oldest first; a segment's unterminated
    tail comes as bytes (a torn write)."""
    for seg in chain.segments(path):
        data = seg.read_bytes()
        lines = data.split(b"\n")
        torn = lines.pop()
        for i, raw in enumerate(lines, 1):
            try:
                record = json.loads(raw)
                if not isinstance(record, dict) or not isinstance(record.get("seq"), int) or "prev" not in record:
                    record = None
            except ValueError:
                record = None
            yield seg, Line(f"{seg.name}:{i}", raw, record)
        if torn:
            yield seg, torn


def verify(path: Path, key: bytes) -> Report:
    path = Path(path)
    report = Report()
    segs = chain.segments(path)
    report.segments = len(segs)
    head = _read_head(path, report)
    expect_seq = 0
    macs: OrderedDict[int, str] = OrderedDict()  # seq -> MAC of its line, the last RECENT records
    waiting: dict[int, tuple[str, str]] = {}  # seq -> (the MAC its successor carries, where): not seen yet
    missing: list[list[int]] = []  # [lo, hi] seq ranges skipped; a later record may fill them (reordered)
    torn_at: tuple[str, int] | None = None
    last: dict | None = None
    head_seen = False
    for _seg, line in read_lines(path):
        if isinstance(line, bytes):
            torn_at = (_seg.name, len(line))
            continue
        rec = line.record
        if rec is None:
            if report.records == 0:
                report.foreign = f"{line.where} is not a lineage record: this is not a bulkhead lineage log"
                return report
            report.problems.append(f"{line.where}: not a lineage record (changed, or a line was inserted)")
            continue
        seq = rec["seq"]
        if report.records == 0 and seq == 0 and rec["prev"] != chain.genesis_mac(key):
            report.foreign = (f"{line.where}: record 0 is not chained under this key (a log written under "
                              f"another key, or not a bulkhead lineage log)")
            return report
        report.records += 1
        if torn_at is not None:
            if rec.get("kind") == "open" and rec.get("torn_tail_bytes") == torn_at[1]:
                report.notes.append(f"{torn_at[0]} ends in {torn_at[1]} bytes of a record torn by a crash; the "
                                    f"restart at {line.where} says so")
            else:
                report.problems.append(f"{torn_at[0]} ends in {torn_at[1]} bytes of a partial record (truncated "
                                       f"or written over), before record {seq} at {line.where}")
            torn_at = None
        this_mac = chain.mac(key, line.raw)
        if seq > expect_seq:
            missing.append([expect_seq, seq - 1])
        elif seq < expect_seq:
            if _fill(missing, seq):
                report.problems.append(f"record {seq} is out of order at {line.where} (after record "
                                       f"{expect_seq - 1}): records were reordered")
            else:
                report.problems.append(f"record {seq} appears again at {line.where} (after record "
                                       f"{expect_seq - 1}): a record was duplicated or reordered")
        # The link to the record before, wherever that one stood; checked
        # when both are seen (a reordered pair is checked once it is whole).
        before = macs.get(seq - 1) if seq else chain.genesis_mac(key)
        if before is not None:
            if rec["prev"] != before:
                report.problems.append(f"record {seq - 1} or the link record {seq} ({line.where}) carries to it "
                                       f"was changed: the chain breaks there")
        else:
            waiting[seq - 1] = (rec["prev"], line.where)
        if seq in waiting:
            prev, where = waiting.pop(seq)
            if prev != this_mac:
                report.problems.append(f"record {seq} ({line.where}) or the link record {seq + 1} ({where}) "
                                       f"carries to it was changed: the chain breaks there")
        macs[seq] = this_mac
        if len(macs) > RECENT:
            macs.popitem(last=False)
        if rec.get("kind") == "gap":
            report.lost += int(rec.get("lost", 0))
            report.notes.append(f"{line.where}: the writer lost {rec.get('lost')} records here (it could not "
                                f"write them)")
        if head is not None and seq == head["seq"] and not head_seen:
            head_seen = True
            if chain.head_mac(key, this_mac) != head["head"]:
                report.problems.append(f"record {seq} ({line.where}) is not the record the head file names: it "
                                       f"was changed, or the head file belongs to another log or key")
        expect_seq = max(expect_seq, seq + 1)
        last = rec
    if not segs:
        report.foreign = None
        report.problems.append(f"no lineage log at {path}")
        return report
    if torn_at is not None:
        report.problems.append(f"{torn_at[0]} ends in {torn_at[1]} bytes of a partial record: truncated, or the "
                               f"writer crashed mid-write")
    for lo, hi in missing:
        what = f"record {lo}" if lo == hi else f"records {lo}..{hi}"
        report.problems.append(f"{what} missing (removed, or a segment deleted)")
    if head is not None and last is not None:
        if head["seq"] > last["seq"]:
            report.problems.append(f"the log ends at record {last['seq']} but the head file says record "
                                   f"{head['seq']} was written: records {last['seq'] + 1}..{head['seq']} were cut off")
        elif last.get("kind") == "close" and head["seq"] != last["seq"]:
            report.problems.append(f"records after {head['seq']} follow the head file on a closed log: appended "
                                   f"after the writer closed it")
    if last is not None and last.get("kind") != "close":
        report.notes.append(f"no close record after record {last['seq']}: the writer is running, or stopped "
                            f"without closing (records queued at a crash are not in the log)")
    return report


def _fill(missing: list[list[int]], seq: int) -> bool:
    for r in missing:
        lo, hi = r
        if lo <= seq <= hi:
            missing.remove(r)
            if lo < seq:
                missing.append([lo, seq - 1])
            if seq < hi:
                missing.append([seq + 1, hi])
            missing.sort()
            return True
    return False


def _read_head(path: Path, report: Report) -> dict | None:
    hp = chain.head_path(path)
    try:
        head = json.loads(hp.read_text())
        if not isinstance(head.get("seq"), int) or not isinstance(head.get("head"), str):
            raise ValueError("missing seq or head")
        return head
    except FileNotFoundError:
        if chain.segments(path):
            report.problems.append(f"no head file {hp.name}: cannot tell whether records were cut off the end")
    except (OSError, ValueError, AttributeError) as e:
        report.problems.append(f"head file {hp.name} is unreadable ({e})")
    return None
