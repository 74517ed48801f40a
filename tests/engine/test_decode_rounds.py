"""Decode rounds (bulkhead.engine.decode_rounds): a decode batch costing more
than the latency budget runs as groups of rows, one group a step, every
request one row a round. Planner only: ids and ints, no model."""

from bulkhead.engine.decode_rounds import DecodeRounds, row_cost
from tests.engine.builders import ticket
from tests.engine.test_scheduler import make, run_step

FLOOD = 8
PROMPT = 1030  # each row reads over 1,024 positions: it costs 4 tokens of a pass


def flood_decoding(budget):
    """A scheduler whose heavy tenant has FLOOD requests decoding long contexts."""
    s = make(num_pages=FLOOD * 300, page_size=4, prefill_chunk=2048, max_running=FLOOD + 1,
             decode_step_tokens=budget, whole_pass_tokens=4096)
    s.planner.rounds.budget = 0  # whole batches while the prompts run
    for i in range(FLOOD):
        s.add(ticket(f"heavy{i}", prompt_len=PROMPT, max_tokens=50, tenant="heavy"))
    for _ in range(FLOOD):
        run_step(s)
    assert all(r.decoding for r in s.running) and len(s.running) == FLOOD
    assert len(run_step(s).decode) == FLOOD  # every row ran last in the same step
    s.planner.rounds.budget = budget
    return s


def rows(plan):
    return sorted(w.request_id for w in plan.decode)


def test_a_batch_over_the_budget_runs_in_groups_each_row_once_a_round():
    s = flood_decoding(budget=16)  # 8 rows of 4 tokens = 32: two groups of 4
    assert row_cost(s.running[0]) == 4
    first, second, third = run_step(s), run_step(s), run_step(s)
    assert len(rows(first)) == len(rows(second)) == FLOOD // 2
    assert sorted(rows(first) + rows(second)) == sorted(f"heavy{i}" for i in range(FLOOD))
    assert rows(third) == rows(first)  # the next round, in the same order


def test_a_batch_within_the_budget_is_one_step():
    s = flood_decoding(budget=32)
    assert len(run_step(s).decode) == FLOOD


def test_a_light_prompt_arriving_mid_round_waits_one_group_not_the_batch():
    s = flood_decoding(budget=16)
    first_group = rows(run_step(s))  # the light prompt arrives while it runs
    s.add(ticket("light", prompt_len=6, max_tokens=4, tenant="light"))
    plan = run_step(s)
    assert [w.request_id for w in plan.prefills] == ["light"] and plan.decode == ()  # first tokens first
    group = rows(run_step(s))  # 9 rows of 34 tokens: groups of 3, the rows not run yet first
    assert "light" in group and len(group) == 3 and not set(group) & set(first_group)


def test_deferred_rows_stay_due():
    r = DecodeRounds(budget=4)
    reqs = flood_decoding(budget=0).running
    group = r.group(reqs)
    assert r.group(reqs) == group  # not run (deferred): planned again
    r.ran([q.request_id for q in group])
    assert {q.request_id for q in r.group(reqs)}.isdisjoint(q.request_id for q in group)
