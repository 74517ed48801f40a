"""The benchmark workload's prompts (bench/workload.py)."""

from bench.workload import Prompt, unseen


def test_the_warm_up_prompt_shares_no_prefix_with_the_levels():
    # A server's prefix cache must not answer a measured prompt from the warm-up's.
    for ids in ([5, 9, 7, 3], [4, 8, 4], [6]):
        warm = unseen(Prompt(ids, "text"))
        assert len(warm.ids) == len(ids)
        assert warm.ids[0] != ids[0]
