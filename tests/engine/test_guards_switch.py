"""The benchmark-only guard switch (EngineConfig.guards, `--unsafe-no-guards`):
on by default, and when off it really turns scrubbing and the per-step
checks off, so a benchmark of "guards off" measures what it says."""

import torch

from tests.engine.test_engine import Collector, prompts, submit, swap_victim_page_into_thief_plan


def test_guards_are_on_by_default_and_freed_pages_are_scrubbed(make_engine):
    built = make_engine()  # poison scrub: a scrubbed page is all NaN
    assert built.config.guards and built.engine.runner.config.safe_mode
    sink = Collector()
    submit(built, sink, "r", prompts(1)[0], max_tokens=6, ignore_eos=True)
    built.engine.run_until_idle()
    assert sink.final("r").finish_reason == "length"
    assert built.engine.pool.pages_scrubbed > 0
    assert torch.isnan(built.engine.pool.data).all()


def test_guards_off_leaves_freed_pages_unscrubbed_and_skips_step_checks(make_engine):
    built = make_engine(guards=False)
    engine = built.engine
    assert not engine.runner.config.safe_mode
    sink = Collector()
    submit(built, sink, "r", prompts(1)[0], max_tokens=6, ignore_eos=True)
    engine.run_until_idle()
    assert sink.final("r").finish_reason == "length"
    # Every page is free again (the ledger still works) but keeps r's KV.
    engine.check_integrity()
    assert engine.ledger.num_free == engine.ledger.num_pages
    assert engine.pool.pages_scrubbed == 0
    assert not torch.isnan(engine.pool.data).all()


def test_guards_off_serves_a_plan_that_names_another_requests_page(make_engine):
    # The same fault test_engine fails closed with guards on: with them off
    # nothing notices, which is what "off" means (and why serve refuses it
    # with API keys).
    built = make_engine(guards=False)
    engine = built.engine
    sink = Collector()
    submit(built, sink, "victim", prompts(1)[0], max_tokens=12, ignore_eos=True, tenant="alpha")
    submit(built, sink, "thief", prompts(2)[1], max_tokens=12, ignore_eos=True, tenant="beta")
    for _ in range(3):
        engine._take_commands(block=False)
        engine.step()
    fired = swap_victim_page_into_thief_plan(engine)
    engine.run_until_idle()
    assert fired, "the fault never fired"
    assert engine.stats.failures == 0
    assert sink.final("thief").finish_reason == "length"
