"""A light tenant under a heavy tenant's flood, on the engine over a tiny
model: counted in engine steps, not seconds."""

import pytest

from tests.engine.test_engine import Collector, prompts, submit


def steps_to_first_token(built, light_prompt_len=10):
    engine = built.engine
    sink = Collector()
    for i, p in enumerate(prompts(8, length=120)):
        submit(built, sink, f"heavy{i}", p, tenant="heavy", max_tokens=8, ignore_eos=True)
    engine._take_commands(block=False)
    for _ in range(2):
        engine.step()
    submit(built, sink, "light", prompts(1, length=light_prompt_len)[0], tenant="light", max_tokens=4,
           ignore_eos=True)
    engine._take_commands(block=False)
    for step in range(1, 500):
        engine.step()
        if "light" in sink.outputs:
            break
    engine.run_until_idle()
    assert sink.final("light").completion_tokens == 4 and engine.stats.failures == 0
    for i in range(8):
        assert sink.final(f"heavy{i}").completion_tokens == 8
    engine.check_integrity()
    return step


@pytest.mark.parametrize("fair", [True, False])
def test_a_short_prompt_is_not_stuck_behind_a_flood_of_long_ones(make_engine, fair):
    steps = steps_to_first_token(make_engine(prefill_chunk=32, fair=fair))
    if fair:
        assert steps <= 2  # the least-served tenant's prompt goes in the next step
    else:
        assert steps > 20  # first come, first served: behind every long prompt's chunks
