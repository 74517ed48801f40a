"""Per-tenant KV quotas: the pure rules, then the scheduler under page pressure."""

import random

import pytest

from bulkhead.engine.kv_quota import quotas, victim_tenant
from bulkhead.engine.scheduler import Scheduler, SchedulerConfig, TenantShares
from bulkhead.kv.ledger import PageLedger
from tests.engine.builders import complete_step, ticket


def make(num_pages=16, kv_quotas=True, shares=None, **cfg):
    ledger = PageLedger(num_pages)
    return Scheduler(SchedulerConfig(page_size=4, kv_quotas=kv_quotas, **cfg), ledger,
                     reclaim=lambda: ledger.mark_scrubbed(ledger.dirty_pages()), shares=shares)


def test_quotas_are_the_weighted_fair_share_of_active_tenants_unless_set():
    w = {"a": 1.0, "b": 1.0, "c": 2.0}.get
    assert quotas(100, ["a", "b"], w, lambda t: None) == {"a": 50, "b": 50}
    assert quotas(100, ["a", "b", "c"], w, lambda t: None) == {"a": 25, "b": 25, "c": 50}
    assert quotas(100, ["a", "b"], w, {"a": 0.2}.get) == {"a": 20, "b": 80}


def test_a_tenant_within_quota_is_never_the_victim():
    q = {"a": 8, "b": 8}
    assert victim_tenant({"a": 12, "b": 4}, q, "b", 1, may_take_own=True) == "a"
    assert victim_tenant({"a": 8, "b": 8}, q, "b", 1, may_take_own=True) == "b"  # nobody over: its own
    assert victim_tenant({"a": 8, "b": 8}, q, "b", 1, may_take_own=False) is None
    # A waiting request may only reclaim while its tenant stays within quota.
    assert victim_tenant({"a": 12, "b": 4}, q, "b", 2, may_take_own=False) == "a"
    assert victim_tenant({"a": 12, "b": 7}, q, "b", 2, may_take_own=False) is None
    # The requester further over than anyone pays itself.
    assert victim_tenant({"a": 9, "b": 7}, q, "a", 3, may_take_own=True) == "a"


def fill_with(s, tenant, n, steps=6):
    for i in range(n):
        s.add(ticket(f"{tenant}{i}", prompt_len=12, max_tokens=40, tenant=tenant))
    for _ in range(steps):
        complete_step(s, s.schedule())


def fill_pool(s):
    """Tenant a alone fills every page (work-conserving: nobody competes)."""
    fill_with(s, "a", 5, steps=2)
    for _ in range(50):
        if not s.ledger.num_free:
            break
        complete_step(s, s.schedule())
    assert s.held_by_tenant() == {"a": s.ledger.num_pages}


def test_a_newcomer_gets_pages_back_from_a_tenant_over_its_share():
    s = make(num_pages=16)
    fill_pool(s)
    s.add(ticket("b0", prompt_len=4, max_tokens=4, tenant="b"))
    plan = s.schedule()
    assert "b0" in [w.request_id for w in plan.prefills]
    assert plan.preempted and all(rid.startswith("a") for rid in plan.preempted)
    assert s.quota_preemptions == {"a": len(plan.preempted)}
    complete_step(s, plan)


def test_without_quotas_the_newcomer_waits_for_the_flood():
    s = make(num_pages=16, kv_quotas=False)
    fill_pool(s)
    s.add(ticket("b0", prompt_len=4, max_tokens=4, tenant="b"))
    plan = s.schedule()
    assert "b0" not in [w.request_id for w in plan.prefills]


def test_under_random_pressure_no_tenant_within_quota_loses_pages_to_another():
    taken = []
    for seed in range(150):
        rng = random.Random(seed)
        weights = {"a": 1.0, "b": rng.choice([1.0, 2.0]), "c": 1.0}
        s = make(num_pages=24, shares=TenantShares(weight=weights.get), max_running=6, prefill_chunk=8)
        real_victim = s.growth.victim

        def watched(req, need, may_take_own, s=s, real_victim=real_victim):
            held, quota = s.held_by_tenant(), s.kv_quotas()
            victim = real_victim(req, need, may_take_own)
            if victim is not None and victim.tenant != req.tenant:
                taken.append(victim.tenant)
                assert held[victim.tenant] > quota[victim.tenant], (seed, held, quota)
            return victim

        s.growth.victim = watched
        n = 0
        for step in range(120):
            if rng.random() < 0.4:
                n += 1
                tenant = rng.choice("aab" if step < 60 else "abc")
                s.add(ticket(f"r{n}", prompt_len=rng.randint(1, 30), max_tokens=rng.randint(1, 30), tenant=tenant))
            plan = s.schedule()
            if plan is not None:
                complete_step(s, plan)  # checks the quota accounting every step
    assert taken  # the pressure really made tenants take pages from each other


@pytest.mark.parametrize("corrupt", ["count", "tenant"])
def test_integrity_check_catches_wrong_quota_accounting(corrupt):
    s = make(num_pages=16)
    fill_with(s, "a", 2, steps=2)
    s.add(ticket("b0", prompt_len=4, max_tokens=4, tenant="b"))
    complete_step(s, s.schedule())
    if corrupt == "count":
        s.waiting.join("b")  # a live request the scheduler does not hold
    else:
        next(r for r in s.running if r.tenant == "b").tenant = "a"  # pages counted for the wrong tenant
    with pytest.raises(AssertionError):
        s.check_integrity()
