"""How a worker's link thread and its engine thread talk: commands only.

Only the engine thread touches the scheduler (bulkhead/engine/commands.py).
Each tenant's weight and KV share, learnt from verified tickets, goes to the
engine as a `Call` (tell_share); the fair queue's service and per-tenant
figures come back as an EngineSnapshot the engine thread copies (refresh,
latest). Commands apply in order, so a share told before a request is
submitted is in force when the engine queues it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from bulkhead.engine.scheduler import TenantShares

DEFAULT_SHARE = (1.0, None)  # (weight, KV share) of a tenant no ticket has named yet


@dataclass(frozen=True)
class EngineSnapshot:
    """What the engine thread last published, read by the link thread."""
    service: Mapping[str, float] = field(default_factory=dict)  # the fair queue's virtual counter per tenant
    tenants: Mapping[str, dict] = field(default_factory=dict)  # scheduler.tenant_stats(): /server_info's rows
    prefix_cache: Mapping[str, int] = field(default_factory=dict)  # heartbeat counters; empty: no cache


class EngineChannel:
    def __init__(self, engine):
        self.engine = engine
        self.latest = EngineSnapshot()
        self._told: dict[str, tuple[float, float | None]] = {}  # link thread: what the engine was told
        self._asked = False  # a snapshot is on its way: ask for no second one
        table: dict[str, tuple[float, float | None]] = {}  # engine thread only
        shares = TenantShares(weight=lambda t: table.get(t, DEFAULT_SHARE)[0],
                              kv_share=lambda t: table.get(t, DEFAULT_SHARE)[1])
        self._table = table
        engine.call(lambda: setattr(engine.scheduler, "shares", shares))

    def tell_share(self, tenant: str, weight: float, kv_share: float | None) -> None:
        """A verified ticket's share (link thread): queued for the engine if it changed."""
        if self._told.get(tenant) == (weight, kv_share):
            return
        self._told[tenant] = (weight, kv_share)
        self.engine.call(lambda: self._table.__setitem__(tenant, (weight, kv_share)))

    def refresh(self) -> None:
        """Ask the engine thread for a fresh snapshot (at most one in flight)."""
        if self._asked:
            return
        self._asked = True
        self.engine.call(self._take).add_done_callback(self._publish)

    def _take(self) -> EngineSnapshot:  # engine thread
        scheduler = self.engine.scheduler
        cache = scheduler.cache
        counters = {} if cache is None else {"prefix_cache_hit_pages": cache.hits,
                                             "prefix_cache_miss_pages": cache.misses,
                                             "prefix_cache_pages": cache.num_pages}
        return EngineSnapshot(dict(scheduler.waiting.counters), scheduler.tenant_stats(), counters)

    def _publish(self, future) -> None:
        self._asked = False
        if future.exception() is None:  # a failed copy keeps the last one
            self.latest = future.result()
