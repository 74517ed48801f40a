"""The lineage log's writer: events queue up on the caller's thread, and one
thread of its own chains, writes and rotates them (format: chain.py).

The hot path pays one deque append per event (a timestamp and a small
dict). Every `flush_interval_s` the writer thread serializes what queued,
chains each line to the one before, appends the batch with one write and
replaces the head file. A write that fails is retried at the next tick
with the same bytes, from where it stopped, so a transient error loses
nothing; while it lasts, `stats()["error"]` says why (the server's /ready
answers 503 and the metrics count it). If the unwritten bytes outgrow
`max_buffer_bytes`, they are dropped and the next record written is a
`gap` record saying how many were lost: a verifier sees the gap, it is
never silent.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import threading
import time
from pathlib import Path

from bulkhead.lineage import chain
from bulkhead.lineage.sink import LineageSink

log = logging.getLogger(__name__)


# Requests whose adapter the writer remembers at once: far more than an
# engine holds (its queue and batch limits), so only a request that never
# reached an engine is forgotten this way.
MAX_ADAPTER_REQUESTS = 65536


class LineageLogError(RuntimeError):
    """The log cannot be opened or continued (refuse to start)."""


_LISTS = {"pages", "gens", "tenants", "src_pages"}  # page-parallel sequences, written as JSON lists


def _recorder(kind: str, *names: str, adapter: bool = False):
    """A LineageSink method that queues one `kind` record, its arguments
    under `names`; adapter: stamped with the request's adapter (if any)."""
    lists = [name for name in names if name in _LISTS]

    def record(self, *args) -> None:
        fields = dict(zip(names, args))
        for name in lists:
            fields[name] = list(fields[name])
        if adapter:
            fields.update(self._adapter_of(args[0]))
        self._emit(kind, fields)
    return record


class LineageLog(LineageSink):
    enabled = True

    def __init__(self, path: Path, key: bytes, max_bytes: int = 64 * 2**20, flush_interval_s: float = 0.2,
                 process: str = "", max_buffer_bytes: int = 64 * 2**20):
        """path: the segment being written (older ones are path.1, path.2, ...).
        process: who writes it ("colocated", a worker's name), in the open record."""
        if max_bytes <= 0:
            raise ValueError(f"--lineage-max-bytes must be positive, not {max_bytes}")
        self.path = Path(path)
        self._key = key
        self.max_bytes = max_bytes
        self.flush_interval_s = flush_interval_s
        self.max_buffer_bytes = max_buffer_bytes
        self._pending: collections.deque = collections.deque()  # (ts, kind, fields), any thread appends
        self._unwritten: collections.deque = collections.deque()  # (line, its MAC): chained, not on disk
        self._offset = 0  # bytes of the first unwritten line already on disk
        self._flush_lock = threading.Lock()
        self._lost = 0  # records dropped since the last gap record
        self.records_written = 0
        self.writer_cpu_s = 0.0  # CPU the writer thread spent (bench/lineage_overhead.py reports it)
        self.records_lost = 0
        self.write_errors = 0
        self.error: str | None = None
        # request -> its adapter (name, digest), stamped on the request's page records until its end.
        # Bounded: a request that never reaches an engine (a refused transfer) leaves no end record.
        self._adapters: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self._seq, self._prev, torn = self._resume()
        self._on_disk = (self._seq - 1, self._prev)  # the last whole record on disk: (seq, MAC)
        self._fd = self._open()
        self._emit("open", {"process": process, "pid": os.getpid(), "max_bytes": max_bytes,
                            **({"torn_tail_bytes": torn} if torn else {})})
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="bulkhead-lineage", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # -- the events (any thread) ---------------------------------------------
    def _emit(self, kind: str, fields: dict) -> None:
        self._pending.append((time.time(), kind, fields))

    allocated = _recorder("alloc", "request", "tenant", "pages", "gens", adapter=True)
    freed = _recorder("free", "request", "pages", "gens", "tenants")
    donated = _recorder("donate", "request", "page", "gen", "to")
    scrubbed = _recorder("scrub", "pages", "mode")
    reusable = _recorder("reusable", "pages")
    cache_hit = _recorder("cache_hit", "request", "tenant", "pages", "gens", "tenants", adapter=True)
    named = _recorder("name", "request", "tenant", "client_id")
    granted = _recorder("grant", "request", "tenant", "room", "epoch", "pages", "gens")
    transferred = _recorder("transfer", "request", "tenant", "src_pages", "pages", "gens", "manifest")
    committed = _recorder("commit", "request", "tenant", "pages", "gens", "manifest")
    refused = _recorder("refuse", "request", "tenant", "reason", "manifest")

    def adapter(self, request, tenant, name, digest):
        self._adapters[request] = {"adapter": {"name": name, "digest": digest}}
        while len(self._adapters) > MAX_ADAPTER_REQUESTS:
            self._adapters.popitem(last=False)
        self._emit("adapter", {"request": request, "tenant": tenant, "name": name, "digest": digest})

    def _adapter_of(self, request) -> dict:
        return self._adapters.get(request, {})

    def request_end(self, request, tenant, reason):
        self._adapters.pop(request, None)
        self._emit("end", {"request": request, "tenant": tenant, "reason": reason})

    def stats(self) -> dict:
        return {"path": str(self.path), "records_written": self.records_written, "records_pending":
                len(self._pending), "write_errors": self.write_errors, "records_lost": self.records_lost,
                "error": self.error}

    def close(self) -> None:
        """Write what is queued, then a `close` record (a clean end of the log)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._emit("close", {})
        self.flush()
        try:
            os.close(self._fd)
        except OSError:
            pass

    # -- the writer thread ----------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            start = time.thread_time()
            self.flush()
            self.writer_cpu_s += time.thread_time() - start

    def flush(self) -> None:
        """Write what is queued now: the writer thread's tick, close(), and
        tests and tools from any thread (serialised by _flush_lock)."""
        with self._flush_lock:
            batch = []
            while self._pending:
                batch.append(self._pending.popleft())
            if self._lost and not self._unwritten:
                self._append({"ts": round(time.time(), 6), "kind": "gap", "lost": self._lost})
                self._lost = 0
            for ts, kind, fields in batch:
                self._append({"ts": round(ts, 6), "kind": kind, **fields})
            if not self._unwritten:
                return
            try:
                self._write_unwritten()
                self._write_head()
                if self.error is not None:
                    log.warning("lineage log %s is being written again", self.path)
                self.error = None
                self._maybe_rotate()
            except OSError as e:
                self.write_errors += 1
                if self.error is None:
                    log.error("LINEAGE LOG %s CANNOT BE WRITTEN: %s (records are kept and retried; /ready "
                              "is 503 until it is written)", self.path, e)
                self.error = f"{type(e).__name__}: {e}"
                if sum(len(entry[0]) for entry in self._unwritten) > self.max_buffer_bytes:
                    self._drop_unwritten()

    def _append(self, record: dict) -> None:
        line = json.dumps({"seq": self._seq, **record, "prev": self._prev}, separators=(",", ":")).encode()
        self._seq += 1
        self._prev = chain.mac(self._key, line)
        self._unwritten.append((line + b"\n", self._prev, record.get("lost", 0) if record["kind"] == "gap" else 0))

    def _write_unwritten(self) -> None:
        """Append the chained lines, resuming a short or failed write from the
        byte where it stopped, so the file never holds half a line for long."""
        while self._unwritten:
            data = b"".join(entry[0] for entry in self._unwritten)[self._offset:]
            n = os.write(self._fd, data)
            self._offset += n
            while self._unwritten and self._offset >= len(self._unwritten[0][0]):
                line, line_mac, _ = self._unwritten.popleft()
                self._offset -= len(line)
                self._on_disk = (self._seq - len(self._unwritten) - 1, line_mac)
                self.records_written += 1

    def _drop_unwritten(self) -> None:
        """The unwritten lines outgrew their bound: forget them (all but a line
        already partly on disk, which must be finished), rewind the chain to
        the last record kept, and carry a gap record once writing works."""
        keep = 1 if self._offset else 0
        drop = len(self._unwritten) - keep
        lost = 0
        for _ in range(drop):
            _, _, gap = self._unwritten.pop()
            lost += gap or 1  # a dropped gap record's count carries over to the next one
            self.records_lost += 0 if gap else 1
        self._seq -= drop
        self._prev = self._unwritten[0][1] if keep else self._on_disk[1]
        self._lost += lost
        log.error("LINEAGE LOG %s: %d records lost (the log will carry a gap record)", self.path, drop)

    # -- files ------------------------------------------------------------------
    def _open(self) -> int:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as e:
            raise LineageLogError(f"cannot open lineage log {self.path}: {e}") from e

    def _resume(self) -> tuple[int, str, int]:
        """Where the chain stands: (next seq, prev MAC, torn tail bytes). An
        existing log is continued, its last segment moved to the next number."""
        existing = chain.segments(self.path)
        if not existing:
            return 0, chain.genesis_mac(self._key), 0
        last = existing[-1]
        data = last.read_bytes()
        if not data:
            if last == self.path:
                self.path.unlink()
            return self._resume()
        body, _, torn = data.rpartition(b"\n")
        lines = body.split(b"\n")
        try:
            record = json.loads(lines[-1])
            seq = int(record["seq"])
        except (ValueError, KeyError, TypeError) as e:
            raise LineageLogError(f"lineage log {last} does not end in a lineage record ({e}); move it away") from e
        if len(lines) > 1 and chain.mac(self._key, lines[-2]) != record.get("prev"):
            raise LineageLogError(f"lineage log {last} was not written under this key (or its last record was "
                                  f"changed): run `bulkhead lineage verify`, or move it away")
        if last == self.path:  # continued in a fresh segment; this one keeps its name's number
            os.rename(self.path, self.path.with_name(f"{self.path.name}.{chain.next_segment_number(self.path)}"))
        return seq + 1, chain.mac(self._key, lines[-1]), len(torn)

    def _write_head(self) -> None:
        seq, last_mac = self._on_disk
        head = {"seq": seq, "file": self.path.name, "head": chain.head_mac(self._key, last_mac)}
        tmp = chain.head_path(self.path).with_suffix(".tmp")
        tmp.write_text(json.dumps(head))
        os.replace(tmp, chain.head_path(self.path))

    def _maybe_rotate(self) -> None:
        if os.fstat(self._fd).st_size < self.max_bytes:
            return
        os.close(self._fd)
        old = self.path.with_name(f"{self.path.name}.{chain.next_segment_number(self.path)}")
        os.rename(self.path, old)
        self._fd = self._open()
        self._append({"ts": round(time.time(), 6), "kind": "rotate", "previous": old.name})


def open_lineage(path: Path | None, key_file: Path | None, max_bytes: int, process: str) -> LineageSink:
    """The sink `serve` hands the engine: a LineageLog at path (a worker's
    own file when process is a worker's name), or the no-op sink when no
    path is given. Raises LineageLogError (refuse to start) on a missing key
    flag, a log that cannot be opened, or one written under another key."""
    from bulkhead.lineage.sink import NULL_SINK

    if path is None:
        return NULL_SINK
    if key_file is None:
        raise LineageLogError("--lineage-log needs --lineage-key FILE (hex; created, mode 0600, if missing)")
    try:
        key = chain.load_key(Path(key_file), create=True)
    except (OSError, chain.LineageKeyError) as e:
        raise LineageLogError(str(e)) from e
    return LineageLog(Path(path), key, max_bytes=max_bytes, process=process)
