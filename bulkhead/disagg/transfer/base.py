"""The KV transfer data plane: one small interface, backends picked by name.

Prefill and decode each own a KVPool with its own page ids. After prefill has
computed a request's KV, `TransferSource.write_pages` copies its pages into
the pages decode allocated for that request. Who checks what:

    backend  | sees each write on decode | write guard called | drain proof on error
    ---------+---------------------------+--------------------+---------------------
    shm      | no (one-sided memcpy)     | no                 | yes (copy is in-process)
    tcp      | yes (receiver thread)     | yes, per page      | only if the ack arrived
    mooncake | no (one-sided write)      | no                 | no (engine may retry)

Where the guard cannot run, decode's commit-time checks are the guard: the
manifest's generations and per-page digests (bulkhead.protocol.manifest), and
never reusing a page a remote writer may still write until it drains or its
lease expires (invariant 4).
"""

from __future__ import annotations

import importlib
import threading
from abc import ABC, abstractmethod
from typing import Callable

import torch

from bulkhead.kv.layout import KVLayout
from bulkhead.kv.pool import KVPool

BACKENDS = ("shm", "tcp", "mooncake")

# guard(dst_page, dst_generation, request_id) -> whether decode lets this write land
WriteGuard = Callable[[int, int, str], bool]


class TransferError(RuntimeError):
    """A transfer that did not (entirely) happen: refused, peer gone, timeout,
    mismatched geometry. Decode must fail the request (invariant 8).

    drained: True when the backend can prove that no byte of the failed call
    is still on its way to decode's pool; False when it cannot (a timed-out
    socket, an engine that may still be retrying), in which case decode must
    quarantine the pages until the writer's lease expires before reusing them.
    refused_pages: decode pages the write guard turned away (tcp only).
    """

    def __init__(self, message: str, *, drained: bool, refused_pages: tuple[int, ...] = ()):
        super().__init__(message)
        self.drained = drained
        self.refused_pages = refused_pages


class TransferTarget(ABC):
    """Decode's side: owns (or wraps) the storage of decode's KV pool.

    The pool is built over the backend's storage (a shared-memory file, a
    registered buffer) so writes land in it without a further copy. Call
    `descriptor()` once and hand it to prefill over the authenticated control
    plane; it carries everything a source needs (and, for tcp, a session
    token, so it must not be logged or sent anywhere else).

    Thread safety: backends that receive writes on their own thread call the
    guard and copy each page while holding `write_lock`. Decode code that
    releases or reallocates pages should hold the same lock, so no page is
    written after a generation check that has since gone stale.
    """

    name: str
    pool: KVPool
    sees_writes = False  # whether this backend calls the write guard (set_write_guard)

    def __init__(self) -> None:
        self.write_lock = threading.Lock()
        self._guard: WriteGuard | None = None

    @abstractmethod
    def descriptor(self) -> dict:
        """JSON-serializable; what a TransferSource needs to write into `pool`."""

    def set_write_guard(self, guard: WriteGuard) -> None:
        """Where the backend sees each write (tcp), a page the guard rejects is
        dropped and counted, and the source raises TransferError; elsewhere see
        the module's table."""
        self._guard = guard

    def stats(self) -> dict:
        """Counters: bytes_received and pages_written (None where one-sided: decode cannot count what lands
        in its memory), writes_refused, ..."""
        return {"backend": self.name, "bytes_received": None, "pages_written": None, "writes_refused": 0}

    @abstractmethod
    def close(self) -> None:
        """Stop receiving and release the storage's name (file, port, registration).
        The pool tensor stays valid in this process until dropped. Idempotent."""


class TransferSource(ABC):
    """Prefill's side: writes pages of prefill's pool into decode's pool.

    Subclasses implement `_write`; this class serialises calls and counts
    calls and errors (each backend counts bytes and pages itself)."""

    name: str

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats = {"backend": self.name, "bytes_sent": 0, "pages_sent": 0, "calls": 0, "errors": 0}

    def write_pages(self, descriptor: dict, request_id: str, src: KVPool, src_pages: list[int],
                    dst_pages: list[int], dst_generations: list[int]) -> None:
        """Copy src page src_pages[i] (all layers, K and V) into decode page dst_pages[i].

        Returns only when every byte is in decode's pool; raises TransferError
        when refused, when the peer is gone, on timeout or on a geometry
        mismatch. After it returns, no write of this call is in flight; after
        it raises, the same holds when `error.drained` is True (see
        TransferError). Thread-safe per source, one call at a time.
        """
        with self._lock:
            self._stats["calls"] += 1
            try:
                if descriptor.get("backend") != self.name:
                    raise TransferError(f"descriptor is for backend {descriptor.get('backend')!r}, not {self.name}",
                                        drained=True)
                check_geometry(src.data, descriptor["shape"], descriptor["dtype"])
                check_page_lists(src_pages, dst_pages, dst_generations, src.num_pages, descriptor["shape"][0])
                if dst_pages:
                    self._write(descriptor, request_id, src, src_pages, dst_pages, dst_generations)
            except TransferError:
                self._stats["errors"] += 1
                raise

    @abstractmethod
    def _write(self, descriptor, request_id, src, src_pages, dst_pages, dst_generations) -> None:
        """One call's copy of at least one page, its descriptor, geometry and
        page lists checked (under the lock); adds to bytes_sent and pages_sent."""

    def stats(self) -> dict:
        """Counters: bytes_sent, pages_sent, calls, errors, ..."""
        return dict(self._stats)

    @abstractmethod
    def close(self) -> None:
        """Drop connections and mappings. Idempotent."""


# -- what every backend checks before moving a byte --------------------------

def check_page_lists(src_pages, dst_pages, dst_generations, src_num_pages: int, dst_num_pages: int) -> None:
    """Equal lengths, in range, no destination named twice (two writes racing
    for one page would leave it holding whichever landed last)."""
    if not (len(src_pages) == len(dst_pages) == len(dst_generations)):
        raise TransferError(
            f"{len(src_pages)} source pages, {len(dst_pages)} destination pages and "
            f"{len(dst_generations)} generations: they must be equal",
            drained=True,
        )
    bad_src = [p for p in src_pages if not 0 <= p < src_num_pages]
    bad_dst = [p for p in dst_pages if not 0 <= p < dst_num_pages]
    if bad_src or bad_dst:
        raise TransferError(
            f"pages out of range: source {bad_src} (pool has {src_num_pages}), "
            f"destination {bad_dst} (pool has {dst_num_pages})",
            drained=True,
        )
    if len(set(dst_pages)) != len(dst_pages):
        raise TransferError(f"destination pages named twice in {list(dst_pages)}", drained=True)


def check_geometry(src: torch.Tensor, dst_shape, dst_dtype: str) -> None:
    """Every dimension but the page count must match, and so must the dtype."""
    src_shape, dst_shape, src_dtype = tuple(src.shape), tuple(dst_shape), str(src.dtype).removeprefix("torch.")
    if len(src_shape) != 6 or src_shape[1:] != dst_shape[1:]:
        raise TransferError(f"source pool {src_shape} and destination pool {dst_shape} differ in page geometry", drained=True)
    if src_dtype != dst_dtype:
        raise TransferError(f"source pool is {src_dtype}, destination is {dst_dtype}", drained=True)


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise TransferError(f"unknown dtype {name!r} in descriptor", drained=True)
    return dtype


_MODULES = {"shm": "shm", "tcp": "tcp", "mooncake": "mooncake_backend"}


def _backend_module(name: str):
    if name not in BACKENDS:
        raise ValueError(f"transfer backend {name!r} is not one of {BACKENDS}")
    # imported on demand: mooncake's engine is an optional native extra
    return importlib.import_module(f"bulkhead.disagg.transfer.{_MODULES[name]}")


def make_target(name: str, layout: KVLayout, num_pages: int, scrub_mode: str = "zero", **opts) -> TransferTarget:
    """Decode's side of backend `name`, with a fresh pool of num_pages pages."""
    return _backend_module(name).Target(layout, num_pages, scrub_mode, **opts)


def make_source(name: str, **opts) -> TransferSource:
    """Prefill's side of backend `name`."""
    return _backend_module(name).Source(**opts)
