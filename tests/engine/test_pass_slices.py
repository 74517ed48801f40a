"""Passes in slices of layers: while another tenant has work, a long prompt
pass runs a slice per step, and that tenant's prompt and decode rows run in
the steps between (bulkhead.engine.pass_slices). The engine step stays flat:
schedule, run, sample, emit."""

import torch

from bulkhead.engine.pass_slices import InFlightPass, layers_per_slice
from bulkhead.engine.request import FinishReason
from bulkhead.engine.scheduler import PrefillWork, SchedulerConfig
from tests.engine.builders import complete_step, ticket
from tests.engine.test_engine import Collector, assert_clean, prompts, submit
from tests.engine.test_fairness import make

HEAVY, LIGHT = prompts(2, length=200)[0], prompts(1, length=12)[0]


def steps_until(built, done, limit=200) -> None:
    for _ in range(limit):
        if done():
            return
        built.engine.run_once()
    raise AssertionError("never happened")


def solo_tokens(make_engine, rid, prompt, tenant, max_tokens=6):
    built, sink = make_engine(prefill_chunk=256), Collector()
    submit(built, sink, rid, prompt, tenant=tenant, max_tokens=max_tokens)
    built.engine.run_until_idle()
    return sink.tokens(rid)


def test_a_short_prompt_arriving_mid_pass_is_answered_before_the_pass_ends(make_engine):
    built, sink = make_engine(prefill_chunk=256), Collector()
    first_step = {}

    def record(out):  # the step that emitted each request's first token
        first_step.setdefault(out.request_id, built.engine.stats.steps)
        sink(out)

    submit(built, record, "other", LIGHT, tenant="light", max_tokens=40)  # another tenant is busy: passes slice
    submit(built, record, "heavy", HEAVY, tenant="heavy", max_tokens=6)
    steps_until(built, lambda: built.engine.scheduler.in_flight is not None)
    submit(built, record, "light", LIGHT, tenant="light2", max_tokens=6)  # arrives with heavy's pass half done
    built.engine.run_until_idle()
    # The tiny model has two layers: light's prompt runs beside heavy's second slice, not after it.
    assert first_step["light"] <= first_step["heavy"]
    assert built.engine.stats.slices == 2
    # Slicing a pass changes none of its numbers, nor its neighbours'.
    assert sink.tokens("heavy") == solo_tokens(make_engine, "heavy", HEAVY, "heavy")
    assert sink.tokens("light") == solo_tokens(make_engine, "light", LIGHT, "light2")
    assert sink.tokens("other") == solo_tokens(make_engine, "other", LIGHT, "light", max_tokens=40)
    assert_clean(built)


def test_a_decoding_tenant_gets_a_token_between_the_slices(make_engine):
    built, sink = make_engine(prefill_chunk=256), Collector()
    submit(built, sink, "light", LIGHT, tenant="light", max_tokens=20)
    steps_until(built, lambda: "light" in sink.outputs)  # decoding
    submit(built, sink, "heavy", HEAVY, tenant="heavy", max_tokens=2)
    steps_until(built, lambda: built.engine.scheduler.in_flight is not None)
    before = len(sink.tokens("light"))
    steps_until(built, lambda: "heavy" in sink.outputs)
    assert len(sink.tokens("light")) > before  # a token while heavy's pass was in flight
    built.engine.run_until_idle()
    assert sink.tokens("light") == solo_tokens(make_engine, "light", LIGHT, "light", max_tokens=20)
    assert_clean(built)


def test_a_tenant_alone_runs_whole_passes(make_engine):
    built, sink = make_engine(prefill_chunk=256), Collector()
    submit(built, sink, "heavy", HEAVY, tenant="heavy", max_tokens=2)
    submit(built, sink, "heavy2", LIGHT, tenant="heavy", max_tokens=2)
    built.engine.run_until_idle()
    assert built.engine.stats.slices == 0 and sink.final("heavy2").completion_tokens == 2


def test_first_come_first_served_and_slice_tokens_0_never_slice(make_engine):
    for overrides in ({"fair": False}, {"slice_tokens": 0}):
        built, sink = make_engine(prefill_chunk=256, **overrides), Collector()
        submit(built, sink, "light", LIGHT, tenant="light", max_tokens=2)
        submit(built, sink, "heavy", HEAVY, tenant="heavy", max_tokens=2)
        built.engine.run_until_idle()
        assert built.engine.stats.slices == 0 and sink.final("heavy").completion_tokens == 2


def test_an_abort_mid_pass_drops_the_paused_rows_and_returns_the_pages_scrubbed(make_engine):
    built, sink = make_engine(prefill_chunk=256), Collector()
    submit(built, sink, "light", LIGHT, tenant="light", max_tokens=30)
    submit(built, sink, "heavy", HEAVY, tenant="heavy", max_tokens=6)
    steps_until(built, lambda: built.engine.scheduler.in_flight is not None)
    assert built.engine.runner.paused_passes == {"heavy"}
    built.engine.abort("heavy")
    built.engine.run_once()
    assert built.engine.runner.paused_passes == set() and built.engine.scheduler.in_flight is None
    assert not built.engine.ledger.pages_of("heavy")
    built.engine.run_until_idle()
    assert sink.final("heavy").finish_reason == FinishReason.ABORT.value and built.engine.stats.failures == 0
    assert sink.final("light").completion_tokens == 30
    assert_clean(built)


def test_a_pass_run_in_slices_computes_the_whole_pass_bit_for_bit(make_engine):
    """The model: start_pass, run_layers per slice, finish_pass == forward."""
    outputs = []
    for sliced in (False, True):
        built = make_engine(prefill_chunk=256)
        runner, model = built.engine.runner, built.engine.runner.model
        pages = tuple(built.engine.ledger.allocate("r", "t", 4))
        work = PrefillWork("r", "t", 0, tuple(HEAVY[:60]), pages, samples=True)
        batch, _ = runner._build_batch([work])
        if sliced:
            state = model.start_pass(batch)
            for first in range(model.config.num_layers):
                state = model.run_layers(batch, runner._layers, state, first, first + 1)
            logits = model.finish_pass(batch, state)
        else:
            logits = model.forward(batch, runner._layers)
        kv = torch.cat([torch.cat((k[list(pages)].flatten(), v[list(pages)].flatten())) for k, v in runner._layers])
        outputs.append((logits, kv))
    assert torch.equal(outputs[0][0], outputs[1][0])
    torch.testing.assert_close(outputs[0][1], outputs[1][1], rtol=0, atol=0, equal_nan=True)  # unwritten: NaN


# -- the scheduler's choice, no model -------------------------------------------
def test_layers_per_slice():
    assert layers_per_slice(30, 512, 128) == 7  # ~128 tokens' worth of a 512-token pass
    assert layers_per_slice(30, 100, 128) == 30  # short: whole
    assert layers_per_slice(30, 8192, 128) == 1  # never less than a layer
    assert layers_per_slice(30, 512, 0) == 30  # slicing off


def slicing_scheduler(**cfg):
    return make(max_running=4, prefill_chunk=64, step_tokens=64, num_layers=4, slice_tokens=16, whole_pass_tokens=32,
                **cfg)


def test_a_chunk_over_a_slice_is_sliced_while_another_tenant_has_work():
    s = slicing_scheduler()
    s.add(ticket("a-mid", prompt_len=24, max_tokens=1, tenant="a"))
    plan = s.schedule()
    assert [w.layers for w in plan.prefills] == [None]  # a alone, within two slices: the whole pass
    s = slicing_scheduler()
    s.add(ticket("a-mid", prompt_len=24, max_tokens=1, tenant="a"))
    s.add(ticket("b-long", prompt_len=64, max_tokens=1, tenant="b"))
    plan = s.schedule()
    assert [(w.request_id, w.layers) for w in plan.prefills] == [("a-mid", (0, 2))]  # b's waits: too long
    s.check_integrity()


def test_a_chunk_over_two_slices_is_sliced_alone_and_its_quiet_slices_carry_no_decode_rows():
    """A prompt that arrives while such a pass runs waits one slice, not the
    pass; while nobody else waits, its tenant's decode rows ran beside its
    first slice and wait for the pass's end, as beside a whole pass."""
    s = slicing_scheduler()
    s.add(ticket("a-dec", prompt_len=4, max_tokens=9, tenant="a"))
    complete_step(s, s.schedule())  # a-dec is decoding
    s.add(ticket("a-long", prompt_len=64, max_tokens=1, tenant="a"))
    plan = s.schedule()
    assert [(w.request_id, w.layers) for w in plan.prefills] == [("a-long", (0, 1))]
    assert [w.request_id for w in plan.decode] == ["a-dec"]
    complete_step(s, plan)
    plan = s.schedule()
    assert [(w.request_id, w.layers) for w in plan.prefills] == [("a-long", (1, 2))] and not plan.decode
    complete_step(s, plan)
    s.add(ticket("b-short", prompt_len=4, max_tokens=2, tenant="b"))  # arrives mid-pass: runs at the next slice
    plan = s.schedule()
    assert [w.request_id for w in plan.prefills] == ["a-long", "b-short"]
    assert not plan.decode  # b's first token first (chunk_planning.py), the decode rows in the next step
    complete_step(s, plan)
    plan = s.schedule()
    assert [w.request_id for w in plan.decode] == ["a-dec", "b-short"]  # contended: everyone's rows run again
    s.check_integrity()


def test_a_pass_in_flight_moves_a_slice_a_step_and_only_its_last_slice_samples():
    s = slicing_scheduler()
    s.add(ticket("a-long", prompt_len=64, max_tokens=2, tenant="a"))
    s.add(ticket("b-long", prompt_len=64, max_tokens=2, tenant="b"))
    seen = []
    for _ in range(4):
        plan = s.schedule()
        seen.append([(w.request_id, w.layers, w.ends_pass) for w in plan.prefills])
        complete_step(s, plan)
    assert seen == [[("a-long", (i, i + 1), i == 3)] for i in range(4)]
    assert s.in_flight is None and s.requests["a-long"].output_token_ids  # sampled once, at the end
    plan = s.schedule()  # b's turn; a decodes beside it
    assert [(w.request_id, w.layers) for w in plan.prefills] == [("b-long", (0, 1))]
    assert [w.request_id for w in plan.decode] == ["a-long"]


def test_short_prompts_join_a_slice_step_and_long_ones_wait():
    s = slicing_scheduler()
    s.add(ticket("a-long", prompt_len=64, max_tokens=1, tenant="a"))
    s.add(ticket("b-dec", prompt_len=4, max_tokens=8, tenant="b"))
    complete_step(s, s.schedule())  # b's short prompt first; a's 64 tokens do not fit beside it
    plan = s.schedule()
    assert [(w.request_id, w.layers) for w in plan.prefills] == [("a-long", (0, 1))]
    complete_step(s, plan)
    s.add(ticket("c-short", prompt_len=12, max_tokens=1, tenant="c"))
    s.add(ticket("d-long", prompt_len=40, max_tokens=1, tenant="d"))
    plan = s.schedule()
    # d's 40 tokens are more than a slice's 16: it waits for a's pass; c's 12 run whole beside the slice.
    assert [(w.request_id, w.layers) for w in plan.prefills] == [("a-long", (1, 2)), ("c-short", None)]
    assert not plan.decode  # c's first token first (chunk_planning.py): b decodes in the next step
    complete_step(s, plan)
    assert [w.request_id for w in s.schedule().decode] == ["b-dec"]
    s.check_integrity()


def test_another_tenants_prompt_a_little_over_a_slice_joins_the_pass_not_waits_it_out():
    """Up to whole_pass_tokens, the first chunk to join a pass in flight when
    another tenant's (chunk_planning._limit): it waited for every slice left."""
    s = slicing_scheduler()
    s.add(ticket("a-long", prompt_len=64, max_tokens=1, tenant="a"))
    complete_step(s, s.schedule())  # a's first slice of four
    s.add(ticket("a-mid", prompt_len=24, max_tokens=1, tenant="a"))
    s.add(ticket("b-mid", prompt_len=24, max_tokens=1, tenant="b"))  # 24 tokens: over a slice (16), within 32
    plan = s.schedule()
    assert [(w.request_id, w.layers) for w in plan.prefills] == [("a-long", (1, 2)), ("b-mid", None)]
    complete_step(s, plan)
    plan = s.schedule()  # a's own 24 tokens wait for its pass: a slice's worth joins, no more
    assert [(w.request_id, w.layers) for w in plan.prefills] == [("a-long", (2, 3))]
    s.check_integrity()


def test_the_request_in_flight_is_never_preempted_for_pages():
    # 16 pages of 4 tokens: a's 56-token prompt holds 14 of them, over its
    # quota of 8, and its pass runs a layer a step for 12 steps while b
    # decodes and needs a new page every 4 tokens.
    s = make(max_running=4, prefill_chunk=64, step_tokens=64, num_layers=12, slice_tokens=4, num_pages=16)
    s.add(ticket("a-long", prompt_len=56, max_tokens=1, tenant="a"))
    s.add(ticket("b", prompt_len=4, max_tokens=30, tenant="b"))
    complete_step(s, s.schedule())
    held = s.ledger.pages_of("a-long")
    assert s.in_flight is not None and len(held) == 14
    for _ in range(10):  # a's slices but the last
        complete_step(s, s.schedule())
        assert s.ledger.pages_of("a-long") == held and s.in_flight is not None
    assert not s.num_preemptions
    plan = s.schedule()
    assert plan.prefills[0].ends_pass
    complete_step(s, plan)
    assert "a-long" not in s.requests  # sampled its one token at the last slice and finished


def test_finishing_the_request_in_flight_ends_its_pass():
    s = slicing_scheduler()
    s.add(ticket("a-long", prompt_len=64, max_tokens=1, tenant="a"))
    s.add(ticket("b", prompt_len=64, max_tokens=1, tenant="b"))
    complete_step(s, s.schedule())
    assert isinstance(s.in_flight, InFlightPass)
    s.finish("a-long", FinishReason.ABORT)
    assert s.in_flight is None
    s.ledger.mark_scrubbed(s.ledger.dirty_pages())
    s.check_integrity()


def test_a_long_pass_makes_a_prompt_arriving_mid_pass_wait_no_longer_than_a_decode_group():
    """Issue 36: under a flood, a light prompt waits out the step in progress
    when it came, planned before it came (so no rule of who waits then can
    shorten it): a slice of the flood's long pass or a decode group. With
    the defaults (SmolLM2's 30 layers, 512-token chunks, a tenant alone), a
    slice costs no more tokens of a pass than a decode group may."""
    cfg = SchedulerConfig(page_size=4, num_layers=30)
    s = make(num_pages=1024, max_running=cfg.max_running, prefill_chunk=cfg.prefill_chunk,
             step_tokens=cfg.step_tokens, num_layers=cfg.num_layers)
    s.add(ticket("flood", prompt_len=1600, max_tokens=1, tenant="heavy"))
    costs = []
    for _ in range(200):
        plan = s.schedule()
        if plan is None:
            break
        for w in plan.prefills:
            first, stop = w.layers or (0, cfg.num_layers)
            costs.append(len(w.token_ids) * (stop - first) / cfg.num_layers)
        complete_step(s, plan)
    assert len(costs) > 4  # sliced: 1,600 tokens are three long chunks and a short one
    assert max(costs) <= cfg.decode_step_tokens


def test_the_slice_budget_changes_no_plan_of_one_tenants_short_prompts():
    """The 16-client throughput workload (bench/peers.py: one tenant, ~256-token
    prompts) runs whole passes, so its steps do not depend on slice_tokens."""
    plans = []
    for slice_tokens in (64, 128):
        s = make(num_pages=1024, max_running=32, prefill_chunk=512, step_tokens=0, num_layers=30,
                 slice_tokens=slice_tokens)
        for i in range(16):
            s.add(ticket(f"r{i}", prompt_len=256, max_tokens=8, tenant="solo"))
        seen = []
        for _ in range(200):
            plan = s.schedule()
            if plan is None:
                break
            seen.append(plan)
            complete_step(s, plan)
        plans.append(seen)
    assert plans[0] == plans[1] and not any(w.layers for p in plans[0] for w in p.prefills)
