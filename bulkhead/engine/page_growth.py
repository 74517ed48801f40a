"""Growth and preemption: pages for a request's next positions. Pure Python.

A request grows before every chunk and decode row. Out of pages, the
scheduler makes room cheapest first: scrub the released pages (reclaim()),
evict unpinned prefix-cache pages, then preempt a running request as the
caller's Preempt policy allows (kv_quota.py's table): its pages released
and scrubbed, its pins dropped, it goes back to the front of its tenant's
line to be recomputed. A request whose pass is in flight is never
preempted (pass_slices.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bulkhead.engine.kv_quota import Preempt, victim_tenant
from bulkhead.engine.request import Request, RequestStatus
from bulkhead.kv.ledger import OutOfPages

if TYPE_CHECKING:
    from bulkhead.engine.scheduler import Scheduler


class PageGrowth:
    def __init__(self, scheduler: Scheduler):
        self._s = scheduler
        self.num_preemptions = 0
        # Requests of a tenant preempted to give its pages to another tenant.
        self.quota_preemptions: dict[str, int] = {}

    def has_room_for(self, req: Request, tokens: int) -> bool:
        """A waiting request may start without preempting anyone within its quota."""
        s = self._s
        # Keep one page of headroom per running request so that admitting a
        # new one does not immediately force a preemption.
        need = -(-tokens // s.config.page_size) - len(req.shared_pages) + len(s.running)
        return s.ledger.num_free + s.ledger.num_dirty + s.pins.num_evictable >= need

    def grow(self, req: Request, tokens: int, preempted: list[str], policy: Preempt) -> bool:
        """Make req hold pages for `tokens` positions, preempting as policy
        allows; preempted collects the ids preempted. False: it could not."""
        s = self._s
        need = -(-tokens // s.config.page_size) - len(s.page_table(req))
        while need > 0:
            try:
                s.ledger.allocate(req.request_id, req.tenant, need)
                return True
            except OutOfPages:
                if s.ledger.num_dirty:
                    s.reclaim()
                    continue
                if s.pins.evict(need):
                    continue
                victim = None if policy is Preempt.NOBODY else self.victim(req, need, policy is Preempt.ANY)
                if victim is None:
                    return False
                self.preempt(victim)
                preempted.append(victim.request_id)
                if victim.tenant != req.tenant:
                    self.quota_preemptions[victim.tenant] = self.quota_preemptions.get(victim.tenant, 0) + 1
                if victim is req:
                    return False
        return True

    def victim(self, req: Request, need: int, may_take_own: bool) -> Request | None:
        """Whom to preempt for req's pages: the newest request of the tenant
        kv_quota picks (with quotas off, the newest request, when req may
        take its own tenant's); never a request whose pass is in flight."""
        s = self._s
        flying = s.in_flight.work.request_id if s.in_flight is not None else None
        preemptible = [r for r in s.running if r.request_id != flying]
        if not s.config.kv_quotas:
            return max(preemptible, key=lambda r: r.arrival) if may_take_own and preemptible else None
        tenant = victim_tenant(s.held_by_tenant(), s.kv_quotas(), req.tenant, need, may_take_own)
        pool = [r for r in preemptible if r.tenant == tenant]
        return max(pool, key=lambda r: r.arrival) if pool else None

    def preempt(self, req: Request) -> None:
        s = self._s
        if s.ledger.pages_of(req.request_id):
            s.ledger.release(req.request_id)
        s.pins.unpin(req)
        s.running.remove(req)
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        s.waiting.appendleft(req)
