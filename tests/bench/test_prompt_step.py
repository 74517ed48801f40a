"""bench/prompt_step.py times steps of prompts through the engine's own
runner, and gives every step's pages back so that the next rep finds them."""
from bench import prompt_step


def test_steps_are_timed_for_each_variant_and_size_and_leave_no_page_held(smollm2_dir):
    times = prompt_step.measure(["auto"], [1, 2], tokens=20, reps=2, model_dir=smollm2_dir)
    assert sorted(n for _, n in times) == [1, 2]
    assert all(len(ts) == 2 and all(t > 0 for t in ts) for ts in times.values())


def test_a_step_gives_its_pages_back(smollm2_dir):
    runner, _ = prompt_step.build(smollm2_dir, "auto", 64)
    free = runner.ledger.num_free
    seconds = prompt_step.step(runner, [tuple(range(1000, 1030)), tuple(range(2000, 2017))])
    assert seconds > 0
    assert runner.ledger.num_free == free and runner.ledger.num_owned == 0 and runner.ledger.num_dirty == 0
