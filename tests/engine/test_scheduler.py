"""Scheduler and ledger together, with no model: ids and ints only."""

import pytest

from bulkhead.engine.admission import Rejection
from bulkhead.engine.request import FinishReason, RequestStatus
from bulkhead.engine.scheduler import Scheduler, SchedulerConfig
from bulkhead.errors import ContextLengthExceeded
from bulkhead.kv.ledger import PageLedger
from bulkhead.kv.prefix_cache import CACHE_OWNER
from tests.engine.builders import FAKE_TOKEN, complete_step, ticket


def make(num_pages=16, page_size=4, **cfg):
    ledger = PageLedger(num_pages)
    return Scheduler(SchedulerConfig(page_size=page_size, **cfg), ledger,
                     reclaim=lambda: ledger.mark_scrubbed(ledger.dirty_pages()))


def run_step(s: Scheduler):
    """One step as the engine does it, with every sampled token = FAKE_TOKEN."""
    plan = s.schedule()
    if plan is not None:
        complete_step(s, plan)
    return plan


def drain(s: Scheduler, limit=1000):
    plans = []
    for _ in range(limit):
        plan = run_step(s)
        if plan is None:
            break
        plans.append(plan)
    return plans


def test_a_rejection_is_refused_by_the_queue():
    s = make()
    rejection = Rejection("r", "t", ContextLengthExceeded("too long"))
    with pytest.raises(TypeError, match="Admitted"):
        s.add(rejection)
    assert not s.has_work()


def test_prefill_then_decode_until_max_tokens():
    s = make()
    s.add(ticket("a", prompt_len=6, max_tokens=3))
    plans = drain(s)
    assert len(plans[0].prefills) == 1 and plans[0].prefills[0].samples
    assert [len(p.decode) for p in plans[1:]] == [1, 1]
    assert not s.has_work() and s.ledger.num_free == 16


def test_new_requests_join_the_running_batch():
    s = make(num_pages=32)
    s.add(ticket("a", prompt_len=4, max_tokens=10))
    run_step(s)  # a prefilled
    run_step(s)  # a decodes
    s.add(ticket("b", prompt_len=4, max_tokens=10))
    plan = run_step(s)  # one step: a decodes while b is prefilled
    assert [w.request_id for w in plan.prefills] == ["b"] and [w.request_id for w in plan.decode] == ["a"]
    plan = run_step(s)
    assert sorted(w.request_id for w in plan.decode) == ["a", "b"]


def test_long_prompts_are_prefilled_in_chunks():
    s = make(num_pages=32, prefill_chunk=5)
    s.add(ticket("a", prompt_len=12, max_tokens=1))
    plans = drain(s)
    chunks = [(w.start, w.end, w.samples) for p in plans for w in p.prefills]
    assert chunks == [(0, 5, False), (5, 10, False), (10, 12, True)]


def test_decoders_are_not_starved_by_a_stream_of_prefills():
    # Every step decodes every decoder; prompts fill the rest of the budget.
    s = make(num_pages=64, prefill_chunk=8, step_tokens=10)
    s.add(ticket("a", prompt_len=4, max_tokens=50))
    run_step(s)  # prefill a
    for i in range(6):
        s.add(ticket(f"p{i}", prompt_len=8, max_tokens=50))
    for _ in range(6):
        plan = run_step(s)
        assert "a" in [w.request_id for w in plan.decode]
        assert plan.num_tokens <= 10 or len(plan.prefills) == 1  # over budget only by one chunk


def test_a_short_prompt_is_prefilled_beside_a_long_one():
    # The long prompt's chunks leave room in each step: the short prompt
    # does not wait for all of them.
    s = make(num_pages=64, prefill_chunk=16, step_tokens=24)
    s.add(ticket("long", prompt_len=64, max_tokens=2))
    s.add(ticket("short", prompt_len=4, max_tokens=2, tenant="beta"))
    plan = run_step(s)
    assert sorted(w.request_id for w in plan.prefills) == ["long", "short"]


def test_chunk_boundaries_do_not_depend_on_batch_mates():
    # Batch invariance: a request's chunks are the same alone and in company.
    def chunks_of(rid, company):
        s = make(num_pages=128, prefill_chunk=8, step_tokens=12)
        s.add(ticket(rid, prompt_len=30, max_tokens=3))
        for i in range(company):
            s.add(ticket(f"o{i}", prompt_len=5 + i, max_tokens=4, tenant="beta"))
        return [(w.start, w.end) for p in drain(s) for w in p.prefills if w.request_id == rid]

    assert chunks_of("r", 0) == chunks_of("r", 3) == [(0, 8), (8, 16), (16, 24), (24, 30)]


def test_max_running_caps_the_batch():
    s = make(num_pages=64, max_running=2)
    for i in range(3):
        s.add(ticket(f"r{i}", prompt_len=4, max_tokens=20))
    for _ in range(6):
        run_step(s)
    assert len(s.running) == 2 and len(s.waiting) == 1


def test_pool_exhaustion_preempts_the_newest_and_recomputes_it():
    # 6 pages of 4 tokens; two requests that each grow to 16 tokens (4 pages).
    s = make(num_pages=6, page_size=4)
    s.add(ticket("old", prompt_len=4, max_tokens=12))
    s.add(ticket("new", prompt_len=4, max_tokens=12))
    plans = drain(s)
    preempted = [rid for p in plans for rid in p.preempted]
    assert preempted and set(preempted) == {"new"}
    assert s.num_preemptions >= 1
    assert not s.has_work() and s.ledger.num_free == 6


def test_preempted_request_recomputes_prompt_and_outputs():
    s = make(num_pages=6, page_size=4)
    s.add(ticket("old", prompt_len=4, max_tokens=12))
    s.add(ticket("new", prompt_len=4, max_tokens=12))
    recompute = None
    for _ in range(200):
        plan = run_step(s)
        if plan is None:
            break
        new = [w for w in plan.prefills if w.request_id == "new"]
        if new and s.requests.get("new") and s.requests["new"].num_preemptions:
            recompute = new[0]
            break
    assert recompute is not None and recompute.start == 0
    assert FAKE_TOKEN in recompute.token_ids  # outputs so far are part of the recomputed sequence


@pytest.mark.parametrize("when", ["waiting", "mid_prefill", "decoding"])
def test_abort_in_every_state_returns_every_page(when):
    s = make(num_pages=16, prefill_chunk=4)
    s.add(ticket("a", prompt_len=10, max_tokens=5))
    if when == "mid_prefill":
        run_step(s)
        assert s.requests["a"].num_computed == 4
    if when == "decoding":
        for _ in range(4):
            run_step(s)
        assert s.requests["a"].decoding
    req = s.finish("a", FinishReason.ABORT)
    assert req.status is RequestStatus.FINISHED and req.finish_reason is FinishReason.ABORT
    s.ledger.mark_scrubbed(s.ledger.dirty_pages())
    s.check_integrity()
    assert s.ledger.num_free == 16 and not s.has_work()


def test_abort_of_unknown_or_finished_request_is_a_no_op():
    s = make()
    assert s.finish("nope", FinishReason.ABORT) is None
    s.add(ticket("a", max_tokens=1))
    drain(s)
    assert s.finish("a", FinishReason.ABORT) is None
    s.check_integrity()


def test_duplicate_request_id_is_refused():
    s = make()
    s.add(ticket("a"))
    with pytest.raises(ValueError):
        s.add(ticket("a"))


def test_pages_in_a_plan_belong_to_the_request_and_cover_its_positions():
    s = make(num_pages=32, page_size=4)
    for i, tenant in enumerate(["alpha", "beta", "alpha"]):
        s.add(ticket(f"r{i}", prompt_len=5 + i, max_tokens=6, tenant=tenant))
    for _ in range(30):
        plan = s.schedule()
        if plan is None:
            break
        for w in [*plan.prefills, *plan.decode]:
            s.ledger.check_readable(w.request_id, w.tenant, list(w.pages), CACHE_OWNER)
            last = (w.end if w in plan.prefills else w.position + 1) - 1
            assert last // 4 < len(w.pages)
        complete_step(s, plan)
    assert not s.has_work()


def test_config_is_validated():
    with pytest.raises(ValueError):
        SchedulerConfig(page_size=0)
