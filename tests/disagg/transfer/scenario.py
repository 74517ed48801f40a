"""Transfer scenarios, run from the prefill side against a DecodePeer process.

pytest calls these directly for shm and tcp; mooncake must run inside a
private network namespace (it binds every interface), so its test runs this
module as a script under `unshare -n`: python -m tests.disagg.transfer.scenario mooncake
"""

from __future__ import annotations

import os
import sys

import torch

from bulkhead.disagg.transfer import TransferError, make_source, page_digests
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.pool import KVPool
from tests.disagg.transfer.decode_peer import LAYOUT, DecodePeer

# a run of consecutive pages on both sides (7..9 -> 11..13) and scattered ones
SRC_PAGES = [3, 0, 7, 8, 9, 15, 2]
DST_PAGES = [20, 5, 11, 12, 13, 1, 6]
SOURCE_OPTS = {"tcp": {"timeout_s": 10.0}}


def make_src(num_pages: int = 16, seed: int = 7) -> KVPool:
    pool = KVPool(KVLayout(**LAYOUT), num_pages)
    pool.data.copy_(torch.randn(pool.data.shape, generator=torch.Generator().manual_seed(seed)))
    return pool


def page_bytes(pool: KVPool, pages: list[int]) -> bytes:
    return pool.data[torch.tensor(pages)].contiguous().view(torch.uint8).numpy().tobytes()


def check_copy(backend: str, **source_opts) -> None:
    """Bytes and digests arrive; pages not named are untouched; shm's file goes on close."""
    src, source = make_src(), make_source(backend, **{**SOURCE_OPTS.get(backend, {}), **source_opts})
    peer = DecodePeer(backend)
    try:
        source.write_pages(peer.descriptor, "req-1", src, SRC_PAGES, DST_PAGES, [1] * len(DST_PAGES))
        assert peer.call("pages", DST_PAGES) == page_bytes(src, SRC_PAGES), "page bytes differ"
        assert peer.call("digests", DST_PAGES) == page_digests(src, SRC_PAGES), "digests differ"
        assert peer.call("changed") == sorted(DST_PAGES), "pages not named were written"
        # a second request over the same connection / mapping
        source.write_pages(peer.descriptor, "req-2", src, [10, 11], [22, 23], [1, 1])
        assert peer.call("digests", [22, 23]) == page_digests(src, [10, 11])
        assert peer.call("changed") == sorted(DST_PAGES + [22, 23])
        assert source.stats()["pages_sent"] == len(DST_PAGES) + 2
        peer.close()
        if backend == "shm":
            assert not os.path.exists(peer.descriptor["path"]), "shm file left behind after close"
    finally:
        peer.kill()
        source.close()


def check_guard_refusal(backend: str) -> None:
    """A stale generation is refused by decode: the source raises, the page stays as it was."""
    src, source = make_src(), make_source(backend, **SOURCE_OPTS.get(backend, {}))
    with DecodePeer(backend) as peer:
        assert peer.sees_writes
        peer.call("generations", {5: 2, 6: 1})
        try:
            source.write_pages(peer.descriptor, "req-1", src, [0, 1], [5, 6], [1, 1])  # page 5 is at gen 2
        except TransferError as e:
            assert e.refused_pages == (5,) and e.drained, (e.refused_pages, e.drained)
        else:
            raise AssertionError("a write at a stale generation was not refused")
        assert peer.call("changed") == [6], "the refused page was written (or the allowed one was not)"
        assert peer.call("stats")["writes_refused"] == 1
    source.close()


def check_dead_peer(backend: str) -> None:
    """decode killed: write_pages raises TransferError (bounded by the source's timeout), never hangs."""
    src, source = make_src(), make_source(backend, **SOURCE_OPTS.get(backend, {}))
    peer = DecodePeer(backend)
    try:
        source.write_pages(peer.descriptor, "req-1", src, [0], [0], [1])  # connection / mapping now live
        peer.kill()
        try:
            source.write_pages(peer.descriptor, "req-2", src, SRC_PAGES, DST_PAGES, [1] * len(DST_PAGES))
        except TransferError:
            pass
        else:
            raise AssertionError("write_pages to a dead decode returned as if delivered")
    finally:
        peer.kill()
        source.close()
        if backend == "shm" and os.path.exists(peer.descriptor["path"]):
            os.unlink(peer.descriptor["path"])  # a crashed decode cannot unlink its file


SCENARIOS = {
    "copy": check_copy,
    "guard": check_guard_refusal,
    "dead_peer": check_dead_peer,
}

if __name__ == "__main__":
    backend, names = sys.argv[1], sys.argv[2:] or ["copy", "dead_peer"]
    for name in names:
        SCENARIOS[name](backend)
        print(f"SCENARIO OK {backend} {name}", flush=True)
