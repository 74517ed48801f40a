"""bench/prompt_step.py times steps of prompts through the engine's own
runner, and gives every step's pages back, scrubbed, so that the next rep
finds them."""
from bench import prompt_parts, prompt_step


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


def test_parts_split_each_step_and_sum_to_its_time(smollm2_dir):
    parts = {}
    times = prompt_step.measure(["auto", "onednn"], [2], tokens=20, reps=2, model_dir=smollm2_dir, parts=parts)
    runners = parts.pop("runners")
    assert set(runners) == {v for v, _ in times}
    for key, spent in parts.items():
        assert tuple(spent) == prompt_parts.PARTS
        assert abs(sum(spent.values()) - sum(times[key])) < 1e-6
        # Every part a prompt pass runs took some time (the C KV write only beside the bf16 attention).
        assert all(spent[p] > 0 for p in ("linears", "attention", "glue", "head")), (key, spent)


def test_a_part_called_inside_another_counts_to_itself():
    ticks = iter(range(100))
    timer = prompt_parts.PartTimer(clock=lambda: next(ticks))
    inner = timer.wrap(lambda: None, "kv write")
    head_inner = timer.wrap(lambda: None, "linears")
    timer.wrap(lambda: inner(), "attention")()  # clock 0, (1, 2), 3
    timer.wrap(lambda: head_inner(), "head", opaque=True)()  # clock 4, 5: the lm_head's linear is the head's
    assert timer.spent == {"attention": 2, "kv write": 1, "head": 1}
