"""The scheduler's check_integrity(): every invariant its parts rely on. Pure Python.

    queues       a request is waiting or running, never both, and the
                 request table holds exactly those; a waiting request holds
                 no page
    batch        a running request holds slots for every computed token
    in flight    a pass in flight belongs to a running request, still at the
                 position and over the pages it was planned with
    transfers    a request awaiting remote KV is neither scheduled nor kept
    pins         prefix_pins.py's invariant; the ledger knows every owner
    tenants      every owned page is counted once, for its tenant; the fair
                 queue counts exactly the live requests; quotas never
                 promise more than the pool
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from bulkhead.engine.request import RequestStatus
from bulkhead.kv.prefix_cache import CACHE_OWNER

if TYPE_CHECKING:
    from bulkhead.engine.scheduler import Scheduler


def check_scheduler(s: Scheduler) -> None:
    running = {r.request_id for r in s.running}
    waiting = {r.request_id for r in s.waiting}
    if running & waiting:
        raise AssertionError(f"requests both running and waiting: {running & waiting}")
    if running | waiting != set(s.requests):
        raise AssertionError("scheduler queues disagree with its request table")
    for r in s.waiting:
        if s.ledger.pages_of(r.request_id) or r.shared_pages:
            raise AssertionError(f"waiting request {r.request_id} holds pages")
    for r in s.running:
        held = len(s.page_table(r)) * s.config.page_size
        if held < r.num_computed:
            raise AssertionError(f"request {r.request_id} computed {r.num_computed} tokens in {held} slots")
    _check_pass_in_flight(s)
    if set(s.awaiting_remote_kv) & (set(s.requests) | set(s.kept)):
        raise AssertionError("a request awaits remote KV and is scheduled or kept")
    live = running | set(s.awaiting_remote_kv) | set(s.kept)
    s.pins.check_integrity([*s.running, *s.kept.values()], live)
    s.ledger.check_integrity(live_requests=live)
    _check_quota_accounting(s)


def _check_pass_in_flight(s: Scheduler) -> None:
    if s.in_flight is None:
        return
    work = s.in_flight.work
    req = s.requests.get(work.request_id)
    if req is None or req.status is not RequestStatus.RUNNING or req.num_computed != work.start:
        raise AssertionError(f"pass in flight for {work.request_id}, which is not running at {work.start}")
    if tuple(s.page_table(req))[: len(work.pages)] != work.pages:
        raise AssertionError(f"{work.request_id}'s pages moved while its pass was in flight")


def _check_quota_accounting(s: Scheduler) -> None:
    """The module docstring's `tenants`: the counts quotas are decided on."""
    s.waiting.check_integrity(dict(Counter(r.tenant for r in s.requests.values())))
    counted = Counter(s.held_by_tenant())
    counted.update(r.tenant for r in s.kept.values() for _ in s.ledger.pages_of(r.request_id))
    counted.update(s.ledger.record(p).tenant for owner in (*s.awaiting_remote_kv, CACHE_OWNER)
                   for p in s.ledger.pages_of(owner))
    counted = {t: n for t, n in counted.items() if n}
    if counted != s.ledger.owned_by_tenant():
        raise AssertionError(f"pages counted per tenant {counted} != ledger {s.ledger.owned_by_tenant()}")
    if sum(s.kv_quotas().values()) > s.ledger.num_pages:
        raise AssertionError(f"quotas {s.kv_quotas()} exceed the pool of {s.ledger.num_pages} pages")
