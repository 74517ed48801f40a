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


# f16 (the bf16 row on fp16 weights, rounded once) reads 30/32 top-1 here, one flip past the bound, both at
# near-ties of the exact model (top-2 margins 0.050 and 0.007 nats; KL mean 3.0e-4, within it): strict, so
# that this says when a kernel change brings it inside; docs/performance.md, "Quality", has the figures.
F16_PAST_TOP1 = pytest.mark.xfail(reason="F16 on the bf16 row: 30/32 top-1 on these prompts (bound 95%)", strict=True)


@pytest.mark.parametrize("fmt", ("q4_1", "q4_0", "bf16", pytest.param("f16", marks=F16_PAST_TOP1)))
def test_auto_stays_within_the_documented_bound_of_the_exact_model(fmt):
    kernels, groups = qg.gate(fmt, qg.work_dir(), TOKENS, LONG, short_prompts=SHORT)
    got = groups["all"]
    assert got["positions"] == TOKENS * (len(SHORT) + len(LONG))
    assert got["top1"] >= got["positions"] * qg.TOP1_BOUND, (kernels, got)
    assert got["kl_mean"] <= qg.KL_MEAN_BOUND, (kernels, got)
