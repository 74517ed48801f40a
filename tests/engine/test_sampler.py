"""The sampler's argmax (numpy's, for float32) picks what torch.argmax picks."""

import torch

from bulkhead.engine.sampler import argmax_rows


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
