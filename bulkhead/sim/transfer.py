"""The simulated KV data plane: in-memory page copies between pools.

`SimTarget` is decode's side and behaves like the tcp receiver: it sees every
write and asks decode's write guard, page by page under `write_lock`, before a
page lands; refused pages make the source raise. Two faults bend writes:

- slow writer: the writer's call times out (TransferError, drained=False: no
  drain ack) while its bytes are still on the wire; they land later, after
  the request may have failed, been released and its pages reused.
- stale handle: a write is delivered again much later carrying the page ids
  and generations it was granted (a duplicating transport, a retried DMA).

Whatever lands, an oracle independent of the guard checks it against decode's
ledger: a page that is no longer the writer's at the granted generation must
not change (`write_on_moved_page`).
"""

from __future__ import annotations

import torch

from bulkhead.disagg.transfer.base import TransferError, TransferSource, TransferTarget
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.pool import KVPool
from bulkhead.sim.context import SimContext

LATE_LANDING_S = (0.05, 3.0)  # beyond the drain lease too: the guard must hold without the fence


class SimTarget(TransferTarget):
    name = "sim"

    def __init__(self, ctx: SimContext, worker: str, incarnation: int, layout: KVLayout, num_pages: int):
        super().__init__()
        self.ctx = ctx
        self.worker = worker
        self.incarnation = incarnation
        self.pool = KVPool(layout, num_pages, "zero")
        self.ledger = None  # decode's ledger, for the oracle (set once the engine exists)
        self.alive = True
        self._stats = {"backend": "sim", "pages_written": 0, "writes_refused": 0}

    @property
    def sees_writes(self) -> bool:
        return True

    def descriptor(self) -> dict:
        return {"backend": "sim", "worker": self.worker, "incarnation": self.incarnation,
                "shape": list(self.pool.data.shape), "dtype": self.pool.layout.dtype}

    def land(self, request_id: str, pages: list[int], generations: list[int], payload: torch.Tensor,
             how: str) -> list[int]:
        """Write payload[i] into page pages[i] where allowed; the refused pages."""
        refused = []
        with self.write_lock:
            for i, (page, gen) in enumerate(zip(pages, generations)):
                allowed = self._guard(page, gen, request_id) if self.ctx.honour_write_guard else True
                if not allowed:
                    refused.append(page)
                    continue
                record = self.ledger.record(page)
                if record.owner != request_id or record.generation != gen:
                    self.ctx.violation("write_on_moved_page",
                                       f"{how} write of {request_id} (gen {gen}) landed on {self.worker} page "
                                       f"{page}, now owner {record.owner} gen {record.generation}")
                self.pool.data[page] = payload[i]
        self._stats["pages_written"] += len(pages) - len(refused)
        self._stats["writes_refused"] += len(refused)
        return refused

    def stats(self) -> dict:
        return dict(self._stats)

    def close(self) -> None:
        self.alive = False


class DataPlane:
    """Finds a descriptor's target (only while that incarnation lives) and carries late writes."""

    def __init__(self, ctx: SimContext):
        self.ctx = ctx
        self.targets: dict[str, SimTarget] = {}
        self.in_flight = 0

    def resolve(self, descriptor: dict) -> SimTarget:
        target = self.targets.get(descriptor.get("worker"))
        if target is None or not target.alive or target.incarnation != descriptor.get("incarnation"):
            raise TransferError(f"decode pool {descriptor} is gone", drained=True)  # as shm's inode check
        return target

    def land_later(self, kind: str, target: SimTarget, rid: str, pages, gens, payload) -> None:
        self.in_flight += 1
        delay = self.ctx.rng.uniform(*LATE_LANDING_S)

        def land() -> None:
            self.in_flight -= 1
            if not target.alive:
                self.ctx.log(f"{kind} write of {rid} to {target.worker}: pool gone, nothing lands")
                return
            refused = target.land(rid, pages, gens, payload, kind)
            self.ctx.fire(kind, f"write of {rid} pages {pages} gens {gens} reached {target.worker}; "
                                f"refused {refused}")

        self.ctx.after(delay, land)


class SimSource(TransferSource):
    name = "sim"

    def __init__(self, ctx: SimContext, plane: DataPlane):
        super().__init__()
        self.ctx = ctx
        self.plane = plane

    def _write(self, descriptor, request_id, src, src_pages, dst_pages, dst_generations) -> None:
        target = self.plane.resolve(descriptor)
        payload = src.data[torch.tensor(src_pages, dtype=torch.long)].clone()
        pages, gens = list(dst_pages), list(dst_generations)
        rng, plan = self.ctx.rng, self.ctx.plan
        if plan.slow_writer and rng.random() < plan.slow_writer:
            self.plane.land_later("slow_writer", target, request_id, pages, gens, payload)
            raise TransferError(f"write of {request_id} timed out; its bytes may still land", drained=False)
        refused = target.land(request_id, pages, gens, payload, "")
        if plan.stale_handle and rng.random() < plan.stale_handle:
            self.plane.land_later("stale_handle", target, request_id, pages, gens, payload)
        self._stats["pages_sent"] += len(pages) - len(refused)
        if refused:
            raise TransferError(f"decode's write guard refused pages {refused} for {request_id}", drained=True,
                                refused_pages=tuple(refused))

    def close(self) -> None:
        pass
