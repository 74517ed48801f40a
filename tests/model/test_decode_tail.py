"""The decode step's tail in the C call (decode_layers.DecodeLayers.step):
the final norm and lm_head give the separate calls' logits bit for bit, the
greedy pick is torch.argmax's on ties, infinities and NaN, and a non-finite
row still fails the step closed."""

import dataclasses

import pytest
import torch

from bulkhead.engine.runner import NonFiniteLogits
from bulkhead.model import bf16in_kernel, decode_layers, i16in_kernel
from bulkhead.model.loader import load_model
from tests.model.test_decode_layers import decode, prefilled, pytestmark  # noqa: F401  (the same skip)

needs_i16in = pytest.mark.skipif(bf16in_kernel.load() is None or i16in_kernel.load() is None,
                                  reason="no AVX-512 BF16 or VNNI here: the lm_head runs bf16w, from Python")


@pytest.fixture(scope="module")
def tail_model(smollm2_dir):
    model = load_model(smollm2_dir, linear_kernel="q4-i16in", decode_attention="c", decode_glue="c")
    assert model.decode_tail_in_c  # the bundled lm_head is Q8_0: q8-i16in, linear_q4's signature
    return model


def odd_rows() -> torch.Tensor:
    """Rows [8, V] with what an argmax can get wrong; V not a multiple of 16."""
    x = torch.randn(8, 49157, generator=torch.Generator().manual_seed(0))
    x[0, ::7] = x[0].max() + 1  # ties: the first of them
    x[1, 40000] = x[1, 49156] = x[1].max() + 1  # a tie whose second is in the scalar tail
    x[2] = float("-inf")  # nothing allowed: index 0
    x[3, 10], x[3, 20] = float("nan"), float("nan")  # NaN counts as the largest: the first NaN
    x[4, 30000] = float("inf")
    x[4, 12] = float("-inf")
    x[5] = 0.0
    x[5, :100] = -0.0  # -0.0 equals 0.0: the first
    x[6, 49156] = x[6].max() + 1  # the largest in the tail alone
    x[7, 5] = float("-inf")  # -inf beside finite values
    return x


def test_each_rows_pick_is_torch_argmaxs_and_the_finite_check_sees_every_value():
    x = odd_rows()
    tail = decode_layers.pick_rows(x)
    assert tail.picks == x.argmax(dim=-1).tolist()
    assert tail.finite is False  # rows 2, 3, 4 and 7
    assert decode_layers.pick_rows(x[[0, 1, 5, 6]]) == decode_layers.StepTail(x[[0, 1, 5, 6]].argmax(-1).tolist(),
                                                                             True)
    for row in (2, 3, 4, 7):
        assert decode_layers.pick_rows(x[row:row + 1]).finite is False, row


@needs_i16in
def test_the_one_call_gives_the_separate_calls_logits_and_the_argmax_of_them(tail_model):
    runner, works = prefilled(tail_model)
    before = runner.pool.data.clone()
    fused = decode(runner, works)
    picks = runner.greedy_picks
    head, tail_model._c_layers._head = tail_model._c_layers._head, None  # the final norm and lm_head from Python
    try:
        runner.pool.data.copy_(before)
        separate = decode(runner, works)
        assert runner.greedy_picks is None and not tail_model.decode_tail_in_c
    finally:
        tail_model._c_layers._head = head
    assert torch.equal(fused, separate)
    assert picks == separate.argmax(-1).tolist()


@needs_i16in
def test_a_nan_row_fails_the_step_closed_and_without_guards_picks_as_torch_does(tail_model):
    runner, works = prefilled(tail_model)
    before = runner.pool.data.clone()
    k, v = runner.pool.layer_views()[5]
    v[works[1].pages[0], 2] = float("nan")  # a position request 1 reads
    with pytest.raises(NonFiniteLogits):
        decode(runner, works)
    runner.pool.data.copy_(before)
    v[works[1].pages[0], 2] = float("nan")
    runner.config = dataclasses.replace(runner.config, safe_mode=False)
    logits = decode(runner, works)
    assert not torch.isfinite(logits[1]).all()
    assert runner.greedy_picks == logits.argmax(-1).tolist()
