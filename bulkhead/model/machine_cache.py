"""What a start-up computes that only this machine, this code and this model
decide, kept under the cache root (~/.cache/bulkhead/startup) so that the
next start reads it instead of computing it again.

A key hashes everything the answer depends on: the CPU's model name and
feature flags (which kernels run, which row counts are batch-invariant),
the source of bulkhead/model (its Python and C: how weights are laid out and
read), torch's version, and what the caller adds (the model's files by name,
size and modification time, the settings asked for). A change to any of them
is a new key, so a stale entry is never read; old entries stay until the
folder is removed (each is a few hundred MB at most; `rm -r` is safe at any
time, the next start computes again).

Entries are written to a temporary name and renamed, so two workers starting
together never read a half-written one.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import math
import os
import platform
import tempfile
from contextlib import contextmanager
from pathlib import Path

from bulkhead.model.gguf_import import cache_root

log = logging.getLogger(__name__)

MODEL_SOURCES = Path(__file__).parent


@functools.cache
def machine_identity() -> str:
    """The CPU's model name and flags, and torch's version."""
    import torch

    lines = []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags")) and line not in lines:
                    lines.append(line)
                if len(lines) >= 2:
                    break
    except OSError:
        lines.append(platform.processor())
    return "".join(lines) + torch.__version__


@functools.cache
def source_hash() -> str:
    """sha256 of bulkhead/model's Python and C sources: a change to how a
    weight is laid out or read invalidates what was laid out before."""
    h = hashlib.sha256()
    for path in sorted([*MODEL_SOURCES.glob("*.py"), *(MODEL_SOURCES / "csrc").glob("*")]):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def model_identity(model_dir: Path) -> list:
    """The model's files by name, size and modification time (not their
    bytes: reading 540 MB to hash it would cost what the cache saves)."""
    files = sorted(p for p in Path(model_dir).iterdir() if p.suffix in (".safetensors", ".json"))
    return [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def key(kind: str, **parts) -> str:
    """The entry name of `kind` for these parts on this machine and code."""
    text = json.dumps({"kind": kind, "machine": machine_identity(), "source": source_hash(), **parts},
                      sort_keys=True, default=str)
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:20]}"


def folder() -> Path:
    return cache_root() / "startup"


@contextmanager
def computing(name: str):
    """Held while one process computes entry `name`: workers starting
    together take turns, and the second finds the first one's entry instead
    of computing it again (a lock file beside it; none where the folder is
    not writable)."""
    try:
        folder().mkdir(parents=True, exist_ok=True)
        f = open(folder() / f"{name}.lock", "w")
    except OSError:
        yield
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            from bulkhead.model.gguf_import import heartbeat

            log.info("waiting for another process computing %s (it is cached for this one)", name)
            with heartbeat(f"waiting for {name}", "another process computes it", log):
                fcntl.flock(f, fcntl.LOCK_EX)
        yield


def read_json(name: str) -> dict | None:
    try:
        return json.loads((folder() / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None


def write_json(name: str, value: dict) -> None:
    _write(folder() / f"{name}.json", lambda tmp: Path(tmp).write_text(json.dumps(value)))


def _write(target: Path, fill) -> None:
    """fill(path) writes the entry at a temporary path, renamed into place."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=target.name + ".", dir=target.parent)
        os.close(fd)
        try:
            fill(tmp)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as e:  # a read-only cache costs the next start time, nothing else
        log.warning("could not cache %s: %s", target.name, e)


def write_tensors(name: str, tensors: dict, metadata: dict) -> None:
    from safetensors.torch import save_file

    _write(folder() / f"{name}.safetensors",
           lambda tmp: save_file(tensors, tmp, metadata={"bulkhead": json.dumps(metadata)}))


def read_tensors(name: str) -> tuple[dict, dict] | None:
    """(tensors, metadata) of an entry, each tensor in memory of its own (not
    a view of the file), or None where there is none or it cannot be read."""
    from safetensors import SafetensorError, safe_open

    path = folder() / f"{name}.safetensors"
    try:
        with safe_open(str(path), "pt") as f:  # checks the header before anything is read
            meta = json.loads(f.metadata()["bulkhead"])
        return _read_each(path), meta
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as e:
        if path.exists():
            log.warning("ignoring the unreadable cache entry %s: %s", path, e)
        return None


# safetensors' dtype names -> torch's (the dtypes laid-out weights are held in).
_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "U8": "uint8", "I8": "int8",
           "I16": "int16", "I32": "int32", "I64": "int64"}


def _read_each(path: Path) -> dict:
    """Every tensor of a safetensors file read straight into memory of its
    own: the whole file never sits in memory beside the tensors (reading its
    bytes first, then the tensors out of them, peaked at twice a 1B model's
    2.7 GB entry), nor is it mapped (its touched pages would count as RSS).
    The tensors are views of one arena on transparent huge pages
    (bulkhead.kv.huge_pages: a decode step streams them, and on 4 KiB pages
    the prefetchers stop at every page), each on a cache line of its own."""
    import torch

    from bulkhead.kv import huge_pages

    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = {k: v for k, v in json.loads(f.read(size)).items() if k != "__metadata__"}
        spans = [info["data_offsets"][1] - info["data_offsets"][0] for info in header.values()]
        room = huge_pages.arena(sum(_on_lines(n) for n in spans))
        out, at = {}, 0
        for (key, info), nbytes in zip(header.items(), spans):
            dtype = getattr(torch, _DTYPES[info["dtype"]])
            numel = math.prod(info["shape"])
            if numel * dtype.itemsize != nbytes:
                raise ValueError(f"tensor {key}: {nbytes} bytes for shape {info['shape']}")
            t = room[at:at + nbytes].view(dtype).view(info["shape"])
            f.seek(8 + size + info["data_offsets"][0])
            if nbytes and f.readinto(memoryview(room[at:at + nbytes].numpy())) != nbytes:
                raise ValueError(f"tensor {key}: the file ends early")
            out[key], at = t, at + _on_lines(nbytes)
    return out


def _on_lines(nbytes: int) -> int:
    """nbytes rounded up to whole cache lines (64 bytes: torch's own alignment)."""
    return -(-nbytes // 64) * 64
