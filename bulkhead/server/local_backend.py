"""The colocated backend: one process, the engine thread beside the HTTP server."""

from __future__ import annotations

import asyncio

from bulkhead.engine.admission import Limits
from bulkhead.engine.builder import BuiltEngine
from bulkhead.engine.outputs import RequestOutput
from bulkhead.engine.scheduler import TenantShares
from bulkhead.kv.prefix_cache import CACHE_OWNER
from bulkhead.lineage import health as lineage_health
from bulkhead.model.config import load_sampling_defaults
from bulkhead.server.metrics import EngineCollector
from bulkhead.serving import memory
from bulkhead.serving.backend import Backend
from bulkhead.serving.fleet_metrics import FleetFigures, kv_usage
from bulkhead.serving.info import engine_info


class LocalBackend(Backend):
    def __init__(self, built: BuiltEngine, model_id: str, auth: str):
        self.built = built
        self.tokenizer = built.tokenizer
        self.model_id = model_id
        self.sampling_defaults = load_sampling_defaults(built.config.model_dir)
        self._auth = auth

    @property
    def limits(self) -> Limits:
        return self.built.limits

    async def generate(self, tickets):
        """Submit tickets together; yield (ticket index, update) until all
        finish. Leaving early aborts every unfinished ticket (its pages scrubbed)."""
        engine = self.built.engine
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
        index = {t.request_id: i for i, t in enumerate(tickets)}
        pending = set(index)

        def sink(out: RequestOutput) -> None:  # runs on the engine thread
            loop.call_soon_threadsafe(updates.put_nowait, (index[out.request_id], out))

        for t in tickets:
            if t.client_id is not None:  # the client's X-Request-Id, for `bulkhead lineage request`
                engine.lineage.named(t.request_id, t.tenant, t.client_id)
            if t.adapter is not None:  # before its first page: every allocation is recorded with it
                engine.lineage.adapter(t.request_id, t.tenant, t.adapter.name, t.adapter.digest)
            engine.submit(t, sink)
        try:
            while pending:
                i, out = await updates.get()
                if out.finished:
                    pending.discard(out.request_id)
                yield i, out
        finally:
            for rid in pending:
                engine.abort(rid)

    def collector(self):
        return EngineCollector(self.built.engine)

    def tenant_stats(self) -> dict[str, dict]:
        return self.built.engine.scheduler.tenant_stats()

    def fleet_figures(self) -> FleetFigures:  # lengths and counts read at scrape time, as EngineCollector's
        engine = self.built.engine
        ledger, sched = engine.ledger, engine.scheduler
        cached = len(ledger.pages_of(CACHE_OWNER))
        return FleetFigures(waiting=len(sched.waiting), running=len(sched.running),
                            kv_usage=kv_usage(ledger.num_pages, ledger.num_free, cached),
                            page_size=self.built.limits.page_size, num_pages=ledger.num_pages)

    def set_tenant_shares(self, weight, kv_share) -> None:
        self.built.engine.scheduler.shares = TenantShares(weight=weight, kv_share=kv_share)

    def start(self) -> None:
        self.built.engine.start()

    def stop(self) -> None:
        self.built.engine.stop()

    def not_ready(self) -> list[str]:
        why = lineage_health.unwritable(self.built.engine.lineage.stats())
        return [why] if why else []

    def info(self) -> dict:
        info = engine_info(self.built, self.model_id, role="colocated") | {"auth": self._auth}
        own = info["memory"]
        info["memory"] = memory.section({"colocated": own["rss_bytes"]}, {"colocated": own["kv_pool_bytes"]})
        return info
