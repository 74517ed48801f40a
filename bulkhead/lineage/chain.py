"""The lineage log's format, shared by the writer and the verifier. Pure.

A log is a sequence of segments, oldest first: PATH.1, PATH.2, ..., then
PATH (the one being written). Each line is one JSON record

    {"seq": n, "ts": unix seconds, "kind": ..., <fields>, "prev": hex}

where `prev` is HMAC-SHA256(key, the previous record's line) — for record
0, HMAC(key, GENESIS). The MAC covers the line's exact bytes (without the
newline), so no canonical form is needed and any changed byte breaks the
link to the next record. `seq` counts records across segments, so a
removed or reordered record is located by number. A rotation starts the
new segment with a `rotate` record chained to the old segment's last one.

The chain alone cannot show that records were cut off the end, so after
each batch the writer replaces PATH.head with the last record's seq, file
and HMAC(key, "head:" + its MAC): a head the key's holder did not write
cannot be forged from the log's own contents. A clean shutdown ends the log
with a `close` record.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path

GENESIS = b"bulkhead-lineage/1"
HEAD_SUFFIX = ".head"


class LineageKeyError(ValueError):
    """The key file is missing, unreadable or too short."""


def load_key(path: Path, create: bool = False, what: str = "lineage key") -> bytes:
    """A hex key of at least 16 bytes: the lineage key, or (what="cluster key")
    the control plane's (bulkhead.disagg.signing). create=True (serve) makes
    one, mode 0600, when the file does not exist; verification never creates."""
    path = Path(path)
    if not path.exists():
        if not create:
            raise LineageKeyError(f"{what} file {path} does not exist")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    try:
        key = bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError) as e:
        raise LineageKeyError(f"{what} file {path}: {e}") from e
    if len(key) < 16:
        raise LineageKeyError(f"{what} in {path} is shorter than 16 bytes")
    return key


def mac(key: bytes, line: bytes) -> str:
    return hmac.new(key, line, hashlib.sha256).hexdigest()


def genesis_mac(key: bytes) -> str:
    return mac(key, GENESIS)


def head_mac(key: bytes, last_mac: str) -> str:
    return mac(key, b"head:" + last_mac.encode())


def head_path(path: Path) -> Path:
    return Path(str(path) + HEAD_SUFFIX)


def segments(path: Path) -> list[Path]:
    """PATH's segments, oldest first: PATH.<n> by n, then PATH itself."""
    path = Path(path)
    pattern = re.compile(re.escape(path.name) + r"\.(\d+)$")
    numbered = []
    if path.parent.is_dir():
        for p in path.parent.iterdir():
            match = pattern.match(p.name)
            if match:
                numbered.append((int(match.group(1)), p))
    out = [p for _, p in sorted(numbered)]
    if path.exists():
        out.append(path)
    return out


def next_segment_number(path: Path) -> int:
    numbers = [int(p.name.rsplit(".", 1)[1]) for p in segments(path) if p != Path(path)]
    return max(numbers, default=0) + 1


def worker_log_path(path: Path, worker: str) -> Path:
    """A worker's own log: the worker's name before PATH's suffix
    (lineage.jsonl -> lineage.prefill-0.jsonl), so no two processes share a file."""
    path = Path(path)
    return path.with_name(f"{path.stem}.{worker}{path.suffix}") if path.suffix else path.with_name(
        f"{path.name}.{worker}")


def logs_named(path: Path) -> list[Path]:
    """The logs a name given to `--lineage-log` stands for: PATH itself when
    it has segments (a colocated server's log, or a worker's file named
    directly), then every worker's log beside it (worker_log_path's names,
    found by their current or rotated segments), sorted by name."""
    path = Path(path)
    out = [path] if segments(path) else []
    if path.suffix:
        pattern = re.compile(re.escape(path.stem) + r"\.(.+)" + re.escape(path.suffix) + r"(\.\d+)?$")
    else:  # lineage -> lineage.decode-0; lineage.1 is PATH's own rotated segment, not a worker's
        pattern = re.compile(re.escape(path.name) + r"\.(.*[^\d.].*?)(\.\d+)?$")
    workers = set()
    if path.parent.is_dir():
        for p in path.parent.iterdir():
            match = pattern.match(p.name)
            if match and match.group(1).rsplit(".", 1)[-1] not in ("head", "tmp"):  # head files, not logs
                workers.add(worker_log_path(path, match.group(1)))
    return out + sorted(w for w in workers if w != path and segments(w))
