"""presence, frequency and repetition penalties in the sampler: each moves
the choice the way its definition says, reads only its own request's
tokens (a row does not depend on its batch-mates), and is off at its
neutral value."""
import torch

from bulkhead.engine.request import Request, SamplingParams
from bulkhead.engine.sampler import Sampler

V = 8


def _request(rid, output=(), prompt=(0,), **params) -> Request:
    req = Request(rid, "alpha", list(prompt), SamplingParams(max_tokens=10, temperature=0.0, **params), arrival=0)
    req.output_token_ids = list(output)
    return req


def _logits(*rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


ROW = [0.0, 1.0, 3.0, 2.5, 0.0, 0.0, 0.0, 0.0]  # greedy picks 2, then 3


def test_frequency_penalty_grows_with_each_repeat():
    sampler = Sampler(eos_token_ids=())
    once = _request("a", output=[2], frequency_penalty=0.4)  # 3.0 - 0.4 = 2.6 > 2.5: still 2
    twice = _request("b", output=[2, 2], frequency_penalty=0.4)  # 3.0 - 0.8 = 2.2 < 2.5: now 3
    tokens, _ = sampler.sample([once, twice], _logits(ROW, ROW))
    assert tokens == [2, 3]


def test_presence_penalty_counts_a_token_once():
    sampler = Sampler(eos_token_ids=())
    small = _request("a", output=[2, 2, 2], presence_penalty=0.4)  # 3.0 - 0.4 = 2.6: still 2
    large = _request("b", output=[2], presence_penalty=0.6)  # 2.4 < 2.5: now 3
    assert sampler.sample([small, large], _logits(ROW, ROW))[0] == [2, 3]


def test_a_negative_penalty_encourages_repeats():
    sampler = Sampler(eos_token_ids=())
    req = _request("a", output=[3], frequency_penalty=-1.0)
    assert sampler.sample([req], _logits(ROW))[0] == [3]


def test_repetition_penalty_reads_the_prompt_too_and_scales_by_sign():
    sampler = Sampler(eos_token_ids=())
    from_prompt = _request("a", prompt=[2], repetition_penalty=1.5)  # 3.0 / 1.5 = 2.0 < 2.5: now 3
    row = [-1.0, -0.5, -0.4, -3.0, -9.0, -9.0, -9.0, -9.0]
    negative = _request("b", output=[2], repetition_penalty=2.0)  # -0.4 * 2 = -0.8 < -0.5: now 1
    assert sampler.sample([from_prompt, negative], _logits(ROW, row))[0] == [3, 1]


def test_a_rows_penalties_do_not_depend_on_its_batch_mates():
    sampler = Sampler(eos_token_ids=())
    penalized = _request("a", output=[2, 2], frequency_penalty=0.4)
    plain = _request("b")
    alone = sampler.sample([penalized], _logits(ROW))[0]
    together = sampler.sample([plain, penalized, plain], _logits(ROW, ROW, ROW))[0]
    assert alone == [3] and together == [2, 3, 2]


def test_neutral_values_change_nothing():
    sampler = Sampler(eos_token_ids=())
    req = _request("a", output=[2, 2, 2], presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0)
    assert not req.params.penalized
    assert sampler.sample([req], _logits(ROW))[0] == [2]
