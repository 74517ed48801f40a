"""First tokens first (bulkhead.engine.chunk_planning): a short prompt that
arrives beside another tenant's decoding flood gets a step of its own, so
its first token is emitted before the flood's decode rows run. Planner
only: ids and ints, no model."""

from tests.engine.builders import ticket
from tests.engine.test_scheduler import make, run_step

FLOOD = 6


def flood_decoding(**cfg):
    """A scheduler whose heavy tenant has FLOOD requests decoding."""
    s = make(num_pages=128, prefill_chunk=16, **cfg)
    for i in range(FLOOD):
        s.add(ticket(f"heavy{i}", prompt_len=8, max_tokens=50, tenant="heavy"))
    for _ in range(3):
        run_step(s)
    assert all(r.decoding for r in s.running) and len(s.running) == FLOOD
    return s


def ids(works):
    return sorted(w.request_id for w in works)


def test_a_light_prompt_is_planned_alone_before_the_floods_decode_rows():
    s = flood_decoding()
    s.add(ticket("light", prompt_len=6, max_tokens=4, tenant="light"))
    plan = run_step(s)
    assert ids(plan.prefills) == ["light"] and plan.prefills[0].samples
    assert plan.decode == ()  # its first token leaves before the flood's next pass
    plan = run_step(s)  # the decode rows wait one step, no more
    assert ids(plan.decode) == sorted([f"heavy{i}" for i in range(FLOOD)] + ["light"])


def test_the_decode_rows_never_wait_two_steps_in_a_row():
    s = flood_decoding()
    s.add(ticket("light", prompt_len=6, max_tokens=4, tenant="light"))
    run_step(s)
    s.add(ticket("light2", prompt_len=6, max_tokens=4, tenant="light2"))
    plan = run_step(s)
    assert ids(plan.prefills) == ["light2"] and len(plan.decode) == FLOOD + 1
    plan = run_step(s)
    assert len(plan.decode) == FLOOD + 2


def test_a_tenant_beside_only_its_own_decode_rows_shares_the_step():
    s = flood_decoding()
    s.add(ticket("heavy-late", prompt_len=6, max_tokens=4, tenant="heavy"))
    plan = run_step(s)
    assert ids(plan.prefills) == ["heavy-late"] and len(plan.decode) == FLOOD


def test_a_chunk_that_does_not_end_its_prompt_shares_the_step():
    s = flood_decoding()
    s.add(ticket("light", prompt_len=40, max_tokens=4, tenant="light"))  # 16-token chunks: no token yet
    plan = run_step(s)
    assert ids(plan.prefills) == ["light"] and not plan.prefills[0].samples and len(plan.decode) == FLOOD


def test_a_waiting_first_token_is_another_tenants_one_short_prompt():
    # What keeps a core-lease turn for one more step (Engine._step_in_turn).
    s = flood_decoding()
    assert not s.planner.first_token_waits()  # the flood alone
    s.add(ticket("heavy-next", prompt_len=6, max_tokens=4, tenant="heavy"))
    assert not s.planner.first_token_waits()  # the flood's own queue
    s.add(ticket("long", prompt_len=300, max_tokens=4, tenant="other"))
    assert not s.planner.first_token_waits()  # too long to run whole beside a slice
    s.add(ticket("light", prompt_len=6, max_tokens=4, tenant="light"))
    assert s.planner.first_token_waits()
    fcfs = flood_decoding(fair=False)
    fcfs.add(ticket("light", prompt_len=6, max_tokens=4, tenant="light"))
    assert not fcfs.planner.first_token_waits()  # first come, first served lets nobody ahead
