"""The sampler's argmax (numpy's, for float32) picks what torch.argmax picks,
and it takes the step's own greedy picks only where they are the answer."""

import torch

from bulkhead.engine.request import Request, SamplingParams
from bulkhead.engine.sampler import Sampler, argmax_rows


def test_argmax_rows_matches_torch_on_ties_infinities_and_nan():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 49152, generator=g)
    x[0, ::7] = x[0].max() + 1  # ties: the first of them
    x[1] = float("-inf")  # a grammar that forbids everything
    x[1, 4000] = float("-inf")
    x[2, 30000] = float("inf")
    x[3, 10], x[3, 20] = float("nan"), float("nan")  # guards off only: NaN is the largest
    x[4, 49151] = 100.0
    assert argmax_rows(x) == x.argmax(dim=-1).tolist() == [0, 0, 30000, 10, 49151, x[5].argmax().item()]
    assert argmax_rows(x.bfloat16()) == x.bfloat16().argmax(dim=-1).tolist()  # through torch
    assert argmax_rows(x[2:3]) == [30000]


def greedy(rid: str, **params) -> Request:
    return Request(rid, "t", [1, 2, 3], SamplingParams(**{"max_tokens": 8, "temperature": 0.0, **params}), 0)


def test_the_steps_greedy_picks_are_taken_only_where_every_row_samples_greedily_from_raw_logits():
    logits = torch.zeros(2, 64)
    logits[:, 9] = 1.0
    step_picks = [3, 4]  # what ModelRunner.greedy_picks would hold; not the argmax, so that taking them shows
    sampler = Sampler((2,))
    assert sampler.sample([greedy("a"), greedy("b")], logits, step_picks)[0] == [3, 4]
    assert sampler.sample([greedy("a"), greedy("b")], logits)[0] == [9, 9]  # none: its own argmax
    assert sampler.sample([greedy("a"), greedy("b", logit_bias=((5, 9.0),))], logits, step_picks)[0] == [9, 5]
    assert sampler.sample([greedy("a"), greedy("b", top_k=1, temperature=1.0)], logits, step_picks)[0] == [3, 4]


class _MaskingGrammars:
    """A grammar mask that forbids token 9 in every row (GrammarMasks' contract: a copy when it masks)."""

    def masked(self, requests, logits):
        out = logits.clone()
        out[:, 9] = float("-inf")
        return out


def test_a_masked_rows_pick_is_the_samplers_own_not_the_steps():
    logits = torch.zeros(2, 64)
    logits[:, 9], logits[:, 7] = 2.0, 1.0
    assert Sampler((2,), _MaskingGrammars()).sample([greedy("a"), greedy("b")], logits, [9, 9])[0] == [7, 7]
