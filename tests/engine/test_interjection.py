"""Interjection: a less-served tenant's short prompt runs between the layers
of a long prefill pass, not after it (bulkhead.engine.engine's docstring)."""

from bulkhead.engine.request import FinishReason
from bulkhead.engine.scheduler import StepPlan
from tests.engine.builders import FAKE_TOKEN, ticket
from tests.engine.test_engine import Collector, assert_clean, prompts, submit
from tests.engine.test_fairness import make

HEAVY, LIGHT = prompts(2, length=200)[0], prompts(1, length=12)[0]


def during_heavy_pass(built, action) -> dict:
    """Run action() once, when the heavy prompt's first prefill pass starts
    (so what it queues arrives mid-pass). Returns what was seen: whether the
    heavy pass had finished when the light tenant's first token came out."""
    model, seen = built.engine.runner.model, {"heavy_pass_done": False, "acted": False}
    real_forward = model.forward

    def forward(batch, layers, between_layers=None):
        heavy = len(batch.token_ids) >= 100
        if heavy and not seen["acted"]:
            seen["acted"] = True
            action()
        logits = real_forward(batch, layers, between_layers)
        if heavy:
            seen["heavy_pass_done"] = True
        return logits

    model.forward = forward
    return seen


def solo_tokens(make_engine, rid, prompt, tenant):
    built, sink = make_engine(prefill_chunk=256), Collector()
    submit(built, sink, rid, prompt, tenant=tenant, max_tokens=6)
    built.engine.run_until_idle()
    return sink.tokens(rid)


def test_a_short_prompt_arriving_mid_pass_is_answered_before_the_pass_ends(make_engine):
    built, sink = make_engine(prefill_chunk=256), Collector()
    light_first_token_after_heavy_pass = []

    def record(out):
        if out.request_id == "light" and "light" not in sink.outputs:
            light_first_token_after_heavy_pass.append(seen["heavy_pass_done"])
        sink(out)

    seen = during_heavy_pass(built, lambda: submit(built, record, "light", LIGHT, tenant="light", max_tokens=6))
    submit(built, sink, "heavy", HEAVY, tenant="heavy", max_tokens=6)
    built.engine.run_until_idle()
    assert seen["acted"] and built.engine.stats.interjections == 1
    assert light_first_token_after_heavy_pass == [False]
    # Pausing a pass changes none of its numbers, nor the interjected one's.
    assert sink.tokens("heavy") == solo_tokens(make_engine, "heavy", HEAVY, "heavy")
    assert sink.tokens("light") == solo_tokens(make_engine, "light", LIGHT, "light")
    assert_clean(built)


def test_the_same_tenant_does_not_interject_into_its_own_pass(make_engine):
    built, sink = make_engine(prefill_chunk=256), Collector()
    seen = during_heavy_pass(built, lambda: submit(built, sink, "heavy2", LIGHT, tenant="heavy", max_tokens=2))
    submit(built, sink, "heavy", HEAVY, tenant="heavy", max_tokens=2)
    built.engine.run_until_idle()
    assert seen["acted"] and built.engine.stats.interjections == 0
    assert sink.final("heavy2").completion_tokens == 2


def test_first_come_first_served_never_interjects(make_engine):
    built, sink = make_engine(prefill_chunk=256, fair=False), Collector()
    seen = during_heavy_pass(built, lambda: submit(built, sink, "light", LIGHT, tenant="light", max_tokens=2))
    submit(built, sink, "heavy", HEAVY, tenant="heavy", max_tokens=2)
    built.engine.run_until_idle()
    assert seen["acted"] and built.engine.stats.interjections == 0


def test_an_abort_of_the_paused_request_waits_for_the_step_to_end(make_engine):
    # Run mid-pass, the abort would free and scrub the pages the paused pass
    # is writing; it is held, with what follows it, until the step ends.
    built, sink = make_engine(prefill_chunk=256), Collector()

    def abort_then_light():
        built.engine.abort("heavy")
        submit(built, sink, "light", LIGHT, tenant="light", max_tokens=3)

    seen = during_heavy_pass(built, abort_then_light)
    submit(built, sink, "heavy", HEAVY, tenant="heavy", max_tokens=6)
    built.engine.run_until_idle()
    assert seen["acted"] and built.engine.stats.failures == 0
    assert sink.final("heavy").finish_reason == FinishReason.ABORT.value
    assert sink.final("light").completion_tokens == 3
    assert_clean(built)


# -- the scheduler's choice, no model -------------------------------------------
def busy_plan(s, tenant="a", prompt_len=64):
    s.add(ticket(f"{tenant}-long", prompt_len=prompt_len, max_tokens=1, tenant=tenant))
    plan = s.schedule()
    assert [w.request_id for w in plan.prefills] == [f"{tenant}-long"]
    return plan


def test_the_interjected_chunk_is_another_less_served_tenants_and_preempts_nobody():
    s = make(max_running=4, prefill_chunk=16, step_tokens=16)
    busy = busy_plan(s)
    s.add(ticket("a-short", prompt_len=4, max_tokens=1, tenant="a"))
    assert s.plan_interjection(busy) is None  # the busy tenant's own: it waits its turn
    s.add(ticket("b-short", prompt_len=4, max_tokens=1, tenant="b"))
    sub = s.plan_interjection(busy)
    assert [w.request_id for w in sub.prefills] == ["b-short"] and not sub.decode and not sub.preempted
    s.complete(sub, {"b-short": FAKE_TOKEN})
    s.check_integrity()


def test_a_tenant_more_than_a_chunk_ahead_of_the_paused_one_does_not_interject():
    s = make(max_running=4, prefill_chunk=16, step_tokens=16)
    busy = busy_plan(s)
    s.add(ticket("b-short", prompt_len=4, max_tokens=1, tenant="b"))
    # Where a's next chunk would finish: b may be ahead of a, by less than a
    # chunk (its last short prompt ran in this pass), if its own 4 tokens fit.
    a_next = s.waiting.counters["a"] + s.config.prefill_chunk * s.config.prompt_token_cost
    s.waiting.counters["b"] = a_next - 4
    assert s.plan_interjection(busy) is None
    s.waiting.counters["b"] = a_next - 5
    assert s.plan_interjection(busy) is not None


def test_another_flooding_tenant_does_not_run_its_whole_chunk_inside_the_pass():
    s = make(max_running=4, prefill_chunk=16, step_tokens=16)
    busy = busy_plan(s)
    s.add(ticket("c-long", prompt_len=64, max_tokens=1, tenant="c"))
    s.waiting.counters["c"] = s.waiting.counters["a"] - 100  # even a little behind a: not a first chunk of four
    assert s.plan_interjection(busy) is None
    s.add(ticket("c-short", prompt_len=8, max_tokens=1, tenant="c2"))
    s.waiting.counters["c2"] = s.waiting.counters["a"]  # level with a: its whole prompt fits before a's next chunk
    assert [w.request_id for w in s.plan_interjection(busy).prefills] == ["c-short"]


def test_an_interjection_that_needs_a_preemption_is_not_planned():
    # 16 pages of 4 tokens: a's 64-token prompt will hold all of them.
    s = make(max_running=4, prefill_chunk=64, step_tokens=64, num_pages=16)
    busy = busy_plan(s)
    held = s.ledger.pages_of("a-long")
    s.add(ticket("b-short", prompt_len=8, max_tokens=1, tenant="b"))
    assert s.plan_interjection(busy) is None
    assert s.ledger.pages_of("a-long") == held and not s.num_preemptions
    s.check_integrity()


# -- decode rows between the layers -----------------------------------------------
def test_a_less_served_tenants_decode_rows_run_inside_the_pass(make_engine):
    built, sink = make_engine(prefill_chunk=256), Collector()
    built.engine._decode_gap_s = lambda: 0.0  # due at every layer (the real gap is measured in seconds)
    light_tokens_inside_the_pass = []

    def record(out):
        if out.request_id == "light" and seen["acted"] and not seen["heavy_pass_done"]:
            light_tokens_inside_the_pass.extend(out.token_ids)
        sink(out)

    seen = during_heavy_pass(built, lambda: None)
    submit(built, record, "light", LIGHT, tenant="light", max_tokens=6)
    built.engine._take_commands(block=False)
    built.engine.step()  # light is decoding when heavy's prompt arrives
    submit(built, sink, "heavy", HEAVY, tenant="heavy", max_tokens=6)
    built.engine.run_until_idle()
    assert seen["acted"] and built.engine.stats.decode_interjections == 1
    assert len(light_tokens_inside_the_pass) == 1  # the tiny model has one pause: two layers
    # Pausing changes no numbers.
    assert sink.tokens("heavy") == solo_tokens(make_engine, "heavy", HEAVY, "heavy")
    assert sink.tokens("light") == solo_tokens(make_engine, "light", LIGHT, "light")
    assert_clean(built)


def test_the_decode_rows_between_layers_are_less_served_tenants_and_never_preempt():
    s = make(max_running=4, prefill_chunk=16, step_tokens=16)
    for rid, tenant in (("a-dec", "a"), ("b-dec", "b")):
        s.add(ticket(rid, prompt_len=4, max_tokens=8, tenant=tenant))
    while not all(s.requests[r].decoding for r in ("a-dec", "b-dec")):
        plan = s.schedule()
        s.complete(plan, {w.request_id: FAKE_TOKEN for w in plan.prefills if w.samples})
    s.add(ticket("a-long", prompt_len=64, max_tokens=1, tenant="a"))
    plan = s.schedule()  # as the engine runs it: the decode rows first, then the paused prefill pass
    s.complete(StepPlan((), plan.decode, ()), {w.request_id: FAKE_TOKEN for w in plan.decode})
    busy = StepPlan(plan.prefills, (), ())
    assert [w.request_id for w in busy.prefills] == ["a-long"]
    rows = s.plan_decode_between(busy)
    assert [w.request_id for w in rows.decode] == ["a-dec", "b-dec"]  # b's are due; a's ride along
    level = s.waiting.counters["b"]
    s.waiting.counters["b"] = s.waiting.counters["a"] + s.config.prefill_chunk - 1
    assert s.plan_decode_between(busy) is None  # b's next token would put it past a's next chunk
    s.waiting.counters["b"] = level
    s.finish("b-dec", FinishReason.ABORT)
    assert s.plan_decode_between(busy) is None  # a's own rows wait for a's pass
    assert make(fair=False).plan_decode_between(busy) is None
    s.check_integrity()
