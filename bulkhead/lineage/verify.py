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
    if not segs:
        report.problems.append(f"no lineage log at {path}")
        return report
    walk = _Walk(key, report, _read_head(path, report))
    for seg, line in read_lines(path):
        if isinstance(line, bytes):
            walk.torn_at = (seg.name, len(line))
        elif not walk.take(line):
            return report  # a foreign file: nothing after its first line means anything
    walk.finish()
    return report


HEAD = "the head file"  # a Break's successor when the head file's MAC does not match its record


@dataclass(frozen=True)
class Break:
    """The link from record `seq` to what follows it does not match: the
    MAC `successor` (the next record, or the head file) carries for it."""

    seq: int  # -1: the link from the start of the log (GENESIS) to record 0
    where: str  # record seq's file:line
    successor: str  # "record n+1 (file:line)", or "the head file"


def name_breaks(breaks: list[Break]) -> list[str]:
    """Each broken link, worded by what changed. One edit to record k (not
    its `prev`) breaks only the link k -> k+1, and names record k (where
    the edit is, not the line after it). An edited `prev` in record k+1
    breaks k -> k+1 and k+1 -> k+2: a break whose next link also breaks
    cannot tell the two apart, and says so."""
    broken = {b.seq for b in breaks}
    out = []
    for b in sorted(breaks, key=lambda b: b.seq):
        if b.seq < 0:
            out.append(f"the link {b.successor} carries to the start of the log was changed")
        elif b.seq + 1 in broken:
            out.append(f"record {b.seq} ({b.where}), or the link to it that {b.successor} carries, was changed: "
                       f"the chain breaks between them")
        elif b.successor == HEAD:
            out.append(f"record {b.seq} ({b.where}) is not the record the head file names: it was changed, or "
                       f"the head file belongs to another log or key")
        else:
            out.append(f"record {b.seq} ({b.where}) was changed: the link the next record carries to it does "
                       f"not match")
    return out


class _Walk:
    """One pass over a log's lines, oldest first, collecting the report."""

    def __init__(self, key: bytes, report: Report, head: dict | None):
        self.key, self.report, self.head = key, report, head
        self.expect_seq = 0
        self.macs: OrderedDict[int, tuple[str, str]] = OrderedDict()  # seq -> (its MAC, where), the last RECENT
        self.waiting: dict[int, tuple[str, str]] = {}  # seq -> (the MAC its successor carries, where): not seen yet
        self.missing: list[list[int]] = []  # [lo, hi] seqs skipped; a later record may fill them (reordered)
        self.breaks: list[Break] = []
        self.torn_at: tuple[str, int] | None = None
        self.last: dict | None = None
        self.head_seen = False

    def take(self, line: Line) -> bool:
        """Check one line; False when the file is not a lineage log under this key."""
        report, rec = self.report, line.record
        if rec is None:
            if report.records == 0:
                report.foreign = f"{line.where} is not a lineage record: this is not a bulkhead lineage log"
                return False
            report.problems.append(f"{line.where}: not a lineage record (changed, or a line was inserted)")
            return True
        seq = rec["seq"]
        if report.records == 0 and seq == 0 and rec["prev"] != chain.genesis_mac(self.key):
            report.foreign = (f"{line.where}: record 0 is not chained under this key (a log written under "
                              f"another key, or not a bulkhead lineage log)")
            return False
        report.records += 1
        self._torn_before(seq, rec, line.where)
        self._order(seq, line.where)
        this_mac = chain.mac(self.key, line.raw)
        self._link(seq, rec["prev"], this_mac, line.where)
        if rec.get("kind") == "gap":
            report.lost += int(rec.get("lost", 0))
            report.notes.append(f"{line.where}: the writer lost {rec.get('lost')} records here (it could not "
                                f"write them)")
        if self.head is not None and seq == self.head["seq"] and not self.head_seen:
            self.head_seen = True
            if chain.head_mac(self.key, this_mac) != self.head["head"]:
                self.breaks.append(Break(seq, line.where, HEAD))
        self.expect_seq = max(self.expect_seq, seq + 1)
        self.last = rec
        return True

    def _torn_before(self, seq: int, rec: dict, where: str) -> None:
        if self.torn_at is None:
            return
        name, size = self.torn_at
        if rec.get("kind") == "open" and rec.get("torn_tail_bytes") == size:
            self.report.notes.append(f"{name} ends in {size} bytes of a record torn by a crash; the restart at "
                                     f"{where} says so")
        else:
            self.report.problems.append(f"{name} ends in {size} bytes of a partial record (truncated or written "
                                        f"over), before record {seq} at {where}")
        self.torn_at = None

    def _order(self, seq: int, where: str) -> None:
        if seq > self.expect_seq:
            self.missing.append([self.expect_seq, seq - 1])
        elif seq < self.expect_seq:
            if _fill(self.missing, seq):
                self.report.problems.append(f"record {seq} is out of order at {where} (after record "
                                            f"{self.expect_seq - 1}): records were reordered")
            else:
                self.report.problems.append(f"record {seq} appears again at {where} (after record "
                                            f"{self.expect_seq - 1}): a record was duplicated or reordered")

    def _link(self, seq: int, prev: str, this_mac: str, where: str) -> None:
        """The link to the record before, wherever that one stood; checked
        when both are seen (a reordered pair is checked once it is whole)."""
        here = f"record {seq} ({where})"
        before = self.macs.get(seq - 1) if seq else (chain.genesis_mac(self.key), "")
        if before is not None:
            if prev != before[0]:
                self.breaks.append(Break(seq - 1, before[1], here))
        else:
            self.waiting[seq - 1] = (prev, here)
        if seq in self.waiting:
            carried, successor = self.waiting.pop(seq)
            if carried != this_mac:
                self.breaks.append(Break(seq, where, successor))
        self.macs[seq] = (this_mac, where)
        if len(self.macs) > RECENT:
            self.macs.popitem(last=False)

    def finish(self) -> None:
        report, last, head = self.report, self.last, self.head
        report.problems.extend(name_breaks(self.breaks))
        if self.torn_at is not None:
            name, size = self.torn_at
            report.problems.append(f"{name} ends in {size} bytes of a partial record: truncated, or the writer "
                                   f"crashed mid-write")
        for lo, hi in self.missing:
            what = f"record {lo}" if lo == hi else f"records {lo}..{hi}"
            report.problems.append(f"{what} missing (removed, or a segment deleted)")
        if head is not None and last is not None:
            if head["seq"] > last["seq"]:
                report.problems.append(f"the log ends at record {last['seq']} but the head file says record "
                                       f"{head['seq']} was written: records {last['seq'] + 1}..{head['seq']} were "
                                       f"cut off")
            elif last.get("kind") == "close" and head["seq"] != last["seq"]:
                report.problems.append(f"records after {head['seq']} follow the head file on a closed log: "
                                       f"appended after the writer closed it")
        if last is not None and last.get("kind") != "close":
            report.notes.append(f"no close record after record {last['seq']}: the writer is running, or stopped "
                                f"without closing (records queued at a crash are not in the log)")


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
