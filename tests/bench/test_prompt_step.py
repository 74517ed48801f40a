"""bench/prompt_step.py times steps of prompts through the engine's own
runner, and gives every step's pages back, scrubbed, so that the next rep
finds them."""
from bench import prompt_step


def test_every_variant_and_step_size_is_timed(smollm2_dir):
    times = prompt_step.measure(["auto"], [1, 2], tokens=20, reps=2, model_dir=smollm2_dir)
    assert sorted(n for _, n in times) == [1, 2]
    assert all(len(ts) == 2 for ts in times.values())


def test_a_step_gives_its_pages_back_scrubbed(smollm2_dir):
    runner, _ = prompt_step.build(smollm2_dir, "auto", prompts=2, tokens=30)
    free = runner.ledger.num_free
    prompt_step.step(runner, [tuple(range(1000, 1030)), tuple(range(2000, 2017))])
    assert runner.ledger.num_free == free and runner.ledger.num_owned == 0 and runner.ledger.num_dirty == 0
    assert not runner.pool.data.any()  # the pool's scrub writes zeros over what the prompts wrote
