"""A decode process for the transfer tests: exposes a pool through a backend
and answers questions about it over a multiprocessing pipe.

The pool is filled with seeded random values after start-up, so a test can
tell which pages a transfer changed and which it left alone.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

LAYOUT = dict(num_layers=3, num_kv_heads=2, head_dim=8, page_size=4, dtype="float32")
NUM_PAGES = 24


def serve(backend: str, opts: dict, conn) -> None:
    import torch

    from bulkhead.disagg.transfer import make_target, page_digests
    from bulkhead.kv.layout import KVLayout

    target = make_target(backend, KVLayout(**LAYOUT), NUM_PAGES, "zero", **opts)
    data = target.pool.data
    data.copy_(torch.randn(data.shape, generator=torch.Generator().manual_seed(1234)))
    snapshot = data.clone()
    generations: dict[int, int] = {}  # page -> current generation; pages not named accept any
    target.set_write_guard(lambda page, gen, rid: generations.get(page, gen) == gen)
    conn.send(("ready", target.descriptor(), target.sees_writes))
    while True:
        cmd, arg = conn.recv()
        if cmd == "digests":
            conn.send(page_digests(target.pool, arg))
        elif cmd == "pages":
            conn.send(data[torch.tensor(arg)].contiguous().view(torch.uint8).numpy().tobytes())
        elif cmd == "changed":
            diff = (data.view(torch.int32) != snapshot.view(torch.int32)).reshape(NUM_PAGES, -1)
            conn.send(diff.any(dim=1).nonzero().flatten().tolist())
        elif cmd == "generations":
            generations.update(arg)
            conn.send(None)
        elif cmd == "stats":
            conn.send(target.stats())
        elif cmd == "close":
            target.close()
            conn.send(None)
            return


class DecodePeer:
    """Start a decode process; `call` asks it something; `kill` is a crash."""

    def __init__(self, backend: str, **opts):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(backend, opts, child), daemon=True)
        self.proc.start()
        if not self._conn.poll(60):
            self.kill()
            raise RuntimeError(f"decode peer for {backend} did not start")
        _, self.descriptor, self.sees_writes = self._conn.recv()

    def call(self, cmd: str, arg=None):
        self._conn.send((cmd, arg))
        if not self._conn.poll(30):
            raise RuntimeError(f"decode peer did not answer {cmd}")
        return self._conn.recv()

    def close(self) -> None:
        if self.proc.is_alive():
            self.call("close")
        self.proc.join(10)

    def kill(self) -> None:
        if self.proc.is_alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(10)

    def __enter__(self) -> DecodePeer:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()
