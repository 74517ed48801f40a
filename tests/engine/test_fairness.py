"""Fair service across tenants, on the real scheduler and ledger: no model.

The property (VTC, Sheng et al. OSDI 2024, theorem 4.4): while two tenants
of equal weight both have requests waiting, the weighted service they
receive (prompt tokens + 2 x output tokens) differs, over any stretch of
time, by at most 2 * (largest prompt cost + output cost the running batch
can hold): about twice the largest request's cost for a batch of one, and a
request's outputs more per extra batch slot (outputs of running requests
keep coming while the other tenant waits for a slot). A tenant alone gets
every step (work-conserving).
"""

import random

import pytest

from bulkhead.engine.request import FinishReason
from bulkhead.engine.scheduler import Scheduler, SchedulerConfig, TenantShares
from bulkhead.kv.ledger import PageLedger
from tests.engine.builders import FAKE_TOKEN, ticket

MAX_PROMPT, MAX_OUTPUT = 24, 8


def vtc_bound(max_running: int) -> int:
    return 2 * (MAX_PROMPT + 2 * MAX_OUTPUT * max_running)


def make(fair=True, weights=None, num_pages=512, **cfg):
    ledger = PageLedger(num_pages)
    shares = TenantShares(weight=lambda t: (weights or {}).get(t, 1.0))
    cfg = {"max_running": 2, "prefill_chunk": 8, "step_tokens": 10, **cfg}
    return Scheduler(SchedulerConfig(page_size=4, fair=fair, **cfg), ledger,
                     reclaim=lambda: ledger.mark_scrubbed(ledger.dirty_pages()), shares=shares)


def arrivals(rng: random.Random, steps: int) -> dict[int, list[tuple[str, int, int]]]:
    """Tenant a floods from step 0; b starts later (a's counter is then far
    ahead: the lift matters) and comes and goes."""
    out: dict[int, list] = {}

    def add(step, tenant):
        out.setdefault(step, []).append((tenant, rng.randint(1, MAX_PROMPT), rng.randint(1, MAX_OUTPUT)))

    for _ in range(rng.randint(10, 30)):
        add(0, "a")
    for step in range(1, steps):
        if rng.random() < 0.3:
            add(step, "a")
    b_start = rng.randint(5, steps // 2)
    for _ in range(rng.randint(1, 6)):
        add(b_start, "b")
    step = b_start
    while step < steps:
        step += rng.randint(1, 25)
        for _ in range(rng.randint(1, 5)):
            add(step, "b")
    return out


def serve(s: Scheduler, plan_arrivals, steps: int):
    """Run `steps` steps; yield (both tenants backlogged, service so far) at each."""
    served = {"a": 0, "b": 0}
    n = 0
    for step in range(steps):
        for tenant, prompt, out in plan_arrivals.get(step, ()):
            n += 1
            s.add(ticket(f"{tenant}{n}", prompt_len=prompt, max_tokens=out, tenant=tenant))
        backlogged = s.waiting.depth("a") > 0 and s.waiting.depth("b") > 0
        plan = s.schedule()
        yield backlogged, dict(served)
        if plan is None:
            continue
        for w in plan.prefills:
            served[w.tenant] += len(w.token_ids)
        sampled = {w.request_id: FAKE_TOKEN for w in plan.prefills if w.samples}
        sampled.update({w.request_id: FAKE_TOKEN for w in plan.decode})
        for req in s.complete(plan, sampled):
            served[req.tenant] += 2
            if len(req.output_token_ids) >= req.params.max_tokens:
                s.finish(req.request_id, FinishReason.LENGTH)
        s.ledger.mark_scrubbed(s.ledger.dirty_pages())


def worst_gap(s: Scheduler, seed: int, steps: int = 150) -> int:
    """Largest difference in service gained by a over b (or b over a) over
    any stretch of steps in which both kept requests waiting."""
    worst, lo, hi = 0, None, None
    for backlogged, served in serve(s, arrivals(random.Random(seed), steps), steps):
        d = served["a"] - served["b"]
        if not backlogged:
            lo = hi = None
            continue
        lo, hi = (d, d) if lo is None else (min(lo, d), max(hi, d))
        worst = max(worst, hi - lo)
    return worst


def test_two_backlogged_tenants_stay_within_the_vtc_bound():
    # Equal weights, a batch of one: the bound is twice the largest request's cost.
    gaps = [worst_gap(make(max_running=1), seed) for seed in range(2000)]
    assert max(gaps) <= vtc_bound(1) == 2 * (MAX_PROMPT + 2 * MAX_OUTPUT), f"seed {gaps.index(max(gaps))}"


@pytest.mark.parametrize("running, budget, chunk, seeds", [(2, 10, 8, 1000), (4, 40, 16, 300)])
def test_the_bound_holds_with_more_slots_and_several_chunks_a_step(running, budget, chunk, seeds):
    gaps = [worst_gap(make(max_running=running, step_tokens=budget, prefill_chunk=chunk), seed)
            for seed in range(seeds)]
    assert max(gaps) <= vtc_bound(running), f"seed {gaps.index(max(gaps))}: gap {max(gaps)}"


def test_first_come_first_served_breaks_the_bound():
    # The property has teeth: without the fair queue, b waits behind a's flood.
    gaps = [worst_gap(make(fair=False), seed) for seed in range(50)]
    assert max(gaps) > 3 * vtc_bound(2)


def test_a_newly_active_tenant_does_not_bank_idle_time():
    s = make()
    for i in range(40):
        s.add(ticket(f"a{i}", prompt_len=8, max_tokens=8, tenant="a"))
    for _ in range(30):  # a is served alone, and still has requests waiting
        plan = s.schedule()
        sampled = {w.request_id: FAKE_TOKEN for w in [*plan.prefills, *plan.decode]}
        for req in s.complete(plan, sampled):
            if len(req.output_token_ids) >= req.params.max_tokens:
                s.finish(req.request_id, FinishReason.LENGTH)
    a_counter = s.waiting.counters["a"]
    assert a_counter > 100
    s.add(ticket("b0", prompt_len=8, max_tokens=8, tenant="b"))
    assert s.waiting.counters["b"] == a_counter  # lifted to the least active counter, not 0


def test_weights_share_service_in_proportion():
    s = make(weights={"a": 2.0, "b": 1.0}, max_running=1, step_tokens=8)
    for i in range(60):
        s.add(ticket(f"a{i}", prompt_len=8, max_tokens=1, tenant="a"))
        s.add(ticket(f"b{i}", prompt_len=8, max_tokens=1, tenant="b"))
    served = {"a": 0, "b": 0}
    for _ in range(60):
        plan = s.schedule()
        for w in plan.prefills:
            served[w.tenant] += 1
        for req in s.complete(plan, {w.request_id: FAKE_TOKEN for w in plan.prefills if w.samples}):
            s.finish(req.request_id, FinishReason.LENGTH)
    assert served["a"] == pytest.approx(2 * served["b"], abs=2)


def test_a_tenant_alone_gets_every_step():
    # Work-conserving: b's absence holds nothing back from a.
    s = make(max_running=4, step_tokens=40, prefill_chunk=16)
    for i in range(8):
        s.add(ticket(f"a{i}", prompt_len=16, max_tokens=4))
    plan = s.schedule()
    assert plan.num_tokens == 32  # two full chunks: the budget filled by the only tenant


def test_a_tenant_arriving_at_an_idle_server_is_lifted_to_the_last_floor():
    # Else b, arriving after a left, would start at 0 and starve a when it came back.
    from bulkhead.engine.fair_queue import FairQueue

    q = FairQueue(lambda t: 1.0)
    q.join("a")
    q.charge("a", prompt_tokens=1000)
    q.leave("a")
    q.join("b")
    assert q.counters["b"] == 1000
    q.join("a")
    assert q.counters["a"] == 1000


def test_a_newly_active_tenant_level_with_the_flood_goes_first():
    # b is lifted to exactly a's counter: a tie. Ordered by service before
    # the chunk, a's older half-done prompt would win it and b's short prompt
    # would wait one more long chunk; ordered by service after it (the
    # virtual finish tag), b's short chunk goes first.
    s = make(max_running=4, prefill_chunk=16, step_tokens=16)
    s.add(ticket("a0", prompt_len=64, max_tokens=1, tenant="a"))
    s.add(ticket("a1", prompt_len=64, max_tokens=1, tenant="a"))
    plan = s.schedule()
    assert [w.request_id for w in plan.prefills] == ["a0"]
    s.complete(plan, {})
    s.add(ticket("b0", prompt_len=4, max_tokens=1, tenant="b"))
    assert s.waiting.counters["b"] == s.waiting.counters["a"]
    assert [w.request_id for w in s.schedule().prefills] == ["b0"]


def test_first_come_first_served_is_an_order_chosen_once_not_a_branch_in_every_function():
    # Issue 36: the measurement-only order is an object the scheduler is
    # given at construction; no scheduling module reads the fairness flag.
    import inspect

    from bulkhead.engine import chunk_planning, fair_queue, page_growth, prefix_pins, scheduler_integrity
    from bulkhead.engine.prefill_order import FirstComeFirstServed
    from bulkhead.engine.prefill_order import LeastServedFirst

    assert isinstance(make(fair=False).order, FirstComeFirstServed)
    assert isinstance(make().order, LeastServedFirst)
    for module in (chunk_planning, fair_queue, page_growth, prefix_pins, scheduler_integrity):
        assert ".fair" not in inspect.getsource(module), module.__name__
    scheduler_source = inspect.getsource(Scheduler)
    assert scheduler_source.count("config.fair") == 1  # the one choice, in __init__


def test_first_come_first_served_lets_nobody_overtake_a_head_that_did_not_fit():
    s = make(fair=False)
    s.add(ticket("old", tenant="a", prompt_len=8, max_tokens=1))
    s.add(ticket("new", tenant="b", prompt_len=8, max_tokens=1))
    (head, running), = s.order.candidates(s.running, s.waiting, set(), set(), batch_has_room=True)
    assert (head.request_id, running) == ("old", False)
    assert s.order.candidates(s.running, s.waiting, set(), {"old"}, batch_has_room=True) == []
    # Least service first passes over it instead.
    f = make()
    f.add(ticket("old", tenant="a", prompt_len=8, max_tokens=1))
    f.add(ticket("new", tenant="b", prompt_len=8, max_tokens=1))
    left = f.order.candidates(f.running, f.waiting, set(), {"old"}, batch_has_room=True)
    assert [(r.request_id, running) for r, running in left] == [("new", False)]
