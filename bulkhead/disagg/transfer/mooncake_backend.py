"""The mooncake backend: Mooncake Transfer Engine one-sided writes (TCP transport, P2P handshake).

Decode registers its pool's memory; prefill writes each page straight into
it from its own registered pool. The pools are page-major (bulkhead.kv.pool),
so a page is one contiguous range, and a run of pages consecutive on both
sides is one range too.

One-sided: decode never sees the writes, so the write guard cannot run;
decode's commit-time generation and digest checks are the guard. A failed
batch may have landed in part and the engine gives no drain proof, so
errors carry drained=False.

SECURITY: Mooncake's P2P mode binds every interface whatever `host` says.
Both sides therefore refuse to start an engine while this network namespace
has any interface but lo, unless allow_all_interfaces=True says the operator
accepts the exposure; the tests and the bench run under `unshare -n`.
"""

from __future__ import annotations

import logging
import socket

import torch

from bulkhead.disagg.transfer.base import TransferError, TransferSource, TransferTarget
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.pool import KVPool, pool_shape

log = logging.getLogger(__name__)

# Ranges per batch call. Mooncake's TCP lanes reject work ("queue-full", rc -1)
# past about 1,000 ranges in flight, which would fail a healthy transfer.
# Larger batches or 2-3 concurrent calls measured no steady gain here.
_MAX_RANGES = 256
_INSTALL_HINT = ("pip install mooncake-transfer-engine-non-cuda (extra 'mooncake'), "
                 "which needs the system library libibverbs1 (apt-get install -y libibverbs1)")


def non_loopback_interfaces() -> list[str]:
    """Network interfaces other than lo in this process's network namespace.
    (Not /sys/class/net: after `unshare -n` it still lists the old namespace's.)"""
    try:
        return sorted(name for _, name in socket.if_nameindex() if name != "lo")
    except OSError as e:
        return [f"(cannot list interfaces: {e})"]


def _new_engine(host: str, allow_all_interfaces: bool):
    exposed = non_loopback_interfaces()
    if exposed and not allow_all_interfaces:
        # fail closed (invariant 9): Mooncake would listen on these whatever `host` says
        raise TransferError(
            f"Mooncake listens on every interface, and this network namespace has {exposed}; run it in a "
            f"private namespace (unshare -n) or pass allow_all_interfaces=True to accept the exposure",
            drained=True,
        )
    try:
        from mooncake.engine import TransferEngine
    except ImportError as e:  # missing package, or libibverbs.so.1 missing under it
        raise TransferError(f"mooncake backend unavailable ({e}); {_INSTALL_HINT}", drained=True) from e
    engine = TransferEngine()
    rc = engine.initialize(host, "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise TransferError(f"Mooncake TransferEngine.initialize({host!r}, P2PHANDSHAKE, tcp) returned {rc}",
                            drained=True)
    log.warning("Mooncake transfer engine started: it listens on every interface, not only %s", host)
    return engine


def _register(engine, t: torch.Tensor) -> None:
    rc = engine.register_memory(t.data_ptr(), t.numel() * t.element_size())
    if rc != 0:
        raise TransferError(f"Mooncake register_memory of {t.numel() * t.element_size()} bytes returned {rc}",
                            drained=True)


class Target(TransferTarget):
    name = "mooncake"

    def __init__(self, layout: KVLayout, num_pages: int, scrub_mode: str = "zero", host: str = "127.0.0.1",
                 allow_all_interfaces: bool = False):
        super().__init__()
        self._engine = _new_engine(host, allow_all_interfaces)
        data = torch.zeros(pool_shape(layout, num_pages), dtype=getattr(torch, layout.dtype))
        self.pool = KVPool(layout, num_pages, scrub_mode, data=data)
        _register(self._engine, self.pool.data)
        self._session = f"{host}:{self._engine.get_rpc_port()}"

    def descriptor(self) -> dict:
        return {"backend": "mooncake", "session": self._session, "base": self.pool.data.data_ptr(),
                "shape": list(self.pool.data.shape), "dtype": self.pool.layout.dtype}

    def close(self) -> None:
        if self._engine is not None:
            self._engine.unregister_memory(self.pool.data.data_ptr())
            self._engine = None  # the engine stops listening when collected


def page_runs(src_pages, dst_pages) -> list[tuple[int, int, int]]:
    """(first source page, first destination page, length) for each run where
    both lists go up by one at a time: one contiguous range each."""
    runs: list[tuple[int, int, int]] = []
    for s, d in zip(src_pages, dst_pages):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((s, d, 1))
    return runs


def byte_ranges(src_pages, src_base: int, dst_pages, dst_base: int,
                page_bytes: int) -> tuple[list[int], list[int], list[int]]:
    """(source addresses, destination addresses, lengths) covering the pages of
    two page-major pools (bulkhead.kv.pool): one range per run of pages."""
    bufs, peers, lens = [], [], []
    for s, d, n in page_runs(list(src_pages), list(dst_pages)):
        bufs.append(src_base + s * page_bytes)
        peers.append(dst_base + d * page_bytes)
        lens.append(n * page_bytes)
    return bufs, peers, lens


class Source(TransferSource):
    name = "mooncake"

    def __init__(self, host: str = "127.0.0.1", allow_all_interfaces: bool = False):
        """allow_all_interfaces: start even where interfaces other than lo exist."""
        super().__init__()
        self.host = host
        self.allow_all_interfaces = allow_all_interfaces
        self._engine = None
        self._registered: dict[int, torch.Tensor] = {}  # pools registered for one-sided reads of them
        self._stats["ranges"] = 0

    def _register_pool(self, src: KVPool) -> None:
        ptr = src.data.data_ptr()
        if ptr not in self._registered:
            _register(self._engine, src.data)
            self._registered[ptr] = src.data  # held so the address cannot be reused while registered

    def _write(self, descriptor, request_id, src, src_pages, dst_pages, dst_generations) -> None:
        if self._engine is None:
            self._engine = _new_engine(self.host, self.allow_all_interfaces)
        self._register_pool(src)
        page_bytes = src.data[0].numel() * src.data.element_size()  # every layer's K and V of one page
        bufs, peers, lens = byte_ranges(src_pages, src.data.data_ptr(), dst_pages, int(descriptor["base"]),
                                        page_bytes)
        n = len(dst_pages)
        for s in range(0, len(bufs), _MAX_RANGES):
            e = s + _MAX_RANGES
            rc = self._engine.batch_transfer_sync_write(descriptor["session"], bufs[s:e], peers[s:e], lens[s:e])
            if rc != 0:
                raise TransferError(
                    f"Mooncake write of {n} pages for {request_id} to {descriptor['session']} failed (rc {rc}): "
                    f"decode gone, unreachable or refusing; some pages may have landed",
                    drained=False,
                )
        self._stats["bytes_sent"] += sum(lens)
        self._stats["pages_sent"] += n
        self._stats["ranges"] += len(bufs)

    def close(self) -> None:
        with self._lock:
            if self._engine is not None:
                for t in self._registered.values():
                    self._engine.unregister_memory(t.data_ptr())
            self._engine = None
            self._registered.clear()


# make_target / make_source find the classes here
__all__ = ["Source", "Target", "byte_ranges", "page_runs"]
