"""bench/int8_inputs_quality.py rounds each group of 32 inputs to int8 codes times the group's scale."""
import torch

from bench import int8_inputs_quality as q


def test_each_group_is_int8_codes_times_its_scale_within_half_a_step():
    x = torch.randn(3, 64) * torch.tensor([1.0, 100.0]).repeat_interleave(32)  # two groups of different range
    r = q.int8_rounded(x)
    for g in range(2):
        cols = slice(32 * g, 32 * (g + 1))
        scale = x[:, cols].abs().amax(-1, keepdim=True) / 127
        codes = r[:, cols] / scale
        assert torch.allclose(codes, codes.round(), atol=1e-3) and codes.abs().max() <= 127 + 1e-3
        assert ((r[:, cols] - x[:, cols]).abs() <= scale / 2 * (1 + 1e-5)).all()


def test_a_zero_group_stays_zero():
    assert torch.equal(q.int8_rounded(torch.zeros(2, 32)), torch.zeros(2, 32))


def test_no_rows_give_no_rows():
    # A prompt chunk that wants no logits runs its last layer's tail on no rows.
    assert q.int8_rounded(torch.zeros(0, 64)).shape == (0, 64)
