"""The quality gate per weight format (docs/performance.md, "Quality"): each
format's fast kernels (`auto`) on SmolLM2 stay within the documented bound of
the exact model on the same stored weights, through the batched serving path
(bench/quality_gate.py on a few of its prompts: three short ones and one of
600 tokens, which the scheduler chunks and slices, in one batch).

The made checkpoints are kept under the bulkhead cache (quality_gate.work_dir):
the first run makes them (about a minute each for the two GGUF imports)."""

import pytest

from bench import quality_gate as qg

SHORT = (qg.PROMPTS[0], qg.PROMPTS[1], qg.PROMPTS[6])  # the README question, a chat message, code
LONG = (600,)
TOKENS = 8


@pytest.mark.parametrize("fmt", ("q4_1", "q4_0", "bf16"))
def test_auto_stays_within_the_documented_bound_of_the_exact_model(fmt):
    kernels, groups = qg.gate(fmt, qg.work_dir(), TOKENS, LONG, short_prompts=SHORT)
    got = groups["all"]
    assert got["positions"] == TOKENS * (len(SHORT) + len(LONG))
    assert got["top1"] >= got["positions"] * qg.TOP1_BOUND, (kernels, got)
    assert got["kl_mean"] <= qg.KL_MEAN_BOUND, (kernels, got)
