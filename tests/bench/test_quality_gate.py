"""The quality gate per weight format (docs/performance.md, "Quality"): each
format's fast kernels (`auto`) on SmolLM2 stay within the documented bound of
the exact model on the same stored weights, through the batched serving path
(bench/quality_gate.py on a few of its prompts: three short ones and one of
600 tokens, which the scheduler chunks and slices, in one batch).

The made checkpoints are kept under the bulkhead cache (quality_gate.work_dir):
the first run makes them (about a minute each for the two GGUF imports)."""

import pytest
import torch

from bench import quality_gate as qg

SHORT = (qg.PROMPTS[0], qg.PROMPTS[1], qg.PROMPTS[6])  # the README question, a chat message, code
LONG = (600,)
TOKENS = 8


# q4_k_m is made by llama.cpp's llama-quantize (bench/setup_llama.sh builds it); where neither it nor the
# made file is here, that format is skipped.
Q4_K_M_MAKEABLE = qg.LLAMA_QUANTIZE.exists() or (qg.work_dir() / "smollm2.Q4_K_M.gguf").exists()


@pytest.mark.parametrize("fmt", ("q4_1", "q4_0", "bf16", "f16", pytest.param(
    "q4_k_m", marks=pytest.mark.skipif(not Q4_K_M_MAKEABLE, reason="no llama-quantize to make a Q4_K_M file"))))
def test_auto_stays_within_the_documented_bound_of_the_exact_model(fmt):
    kernels, groups = qg.gate(fmt, qg.work_dir(), TOKENS, LONG, short_prompts=SHORT)
    got = groups["all"]
    assert got["positions"] == TOKENS * (len(SHORT) + len(LONG))
    assert got["top1_decided"] >= got["decided"] * qg.TOP1_BOUND, (kernels, got)
    assert got["kl_mean"] <= qg.KL_MEAN_BOUND, (kernels, got)


def test_top1_is_bounded_over_the_positions_the_exact_model_decides():
    # Three positions: one a near-tie (0.01 nats) the fast path flips, one decided and kept, one decided
    # and flipped. Only the decided ones count toward top-1; the near-tie's flip still shows in the KL.
    exact = torch.tensor([[1.0, 0.99, -5.0], [3.0, 0.0, -5.0], [3.0, 0.0, -5.0]])
    fast = torch.tensor([[0.99, 1.0, -5.0], [3.0, 0.0, -5.0], [0.0, 3.0, -5.0]])
    got = qg.compare(qg.BatchRun("k", {}, {"r": exact}), qg.BatchRun("k", {}, {"r": fast}), ["r"])
    assert (got["top1"], got["positions"]) == (1, 3)
    assert (got["top1_decided"], got["decided"]) == (1, 2)
    assert got["kl_mean"] > 0
