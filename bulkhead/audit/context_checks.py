"""`bulkhead probe`'s checks at the context limit: over_length (a 2xx just
over the advertised context is a finding, unless generation was clamped at
the context) and coherence (a canary early in a near-limit prompt must be
recalled at its end). Prompts are token ids where the endpoint takes them,
else filler text sized from usage.prompt_tokens.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from bulkhead.audit.probe_client import Reply
from bulkhead.audit.probe_report import CheckResult, ProbeReport

if TYPE_CHECKING:
    from bulkhead.audit.probe import Probe

# Token-id prompts are exact without a tokenizer; this id is an ordinary
# word piece in every Llama-family, Qwen and GPT-2-style vocabulary.
FILLER_TOKEN_ID = 1000
FILLER_SENTENCE = "The quiet river runs past the old mill and the green hills. "


def over_length(probe: Probe, report: ProbeReport, context: int | None) -> None:
    """Prompts just over the advertised context must get a 4xx (a clamped generation is safe)."""
    result = CheckResult("over_length")
    report.checks.append(result)
    if context is None:
        report.skip(result, "the endpoint advertises no context length; pass --context-length",
                    "over-length check skipped: no advertised context length")
        return
    tenant = probe.tenants[-1]
    key = probe.tenant_keys[tenant]
    max_tokens = max(2, probe.args.max_tokens)
    control = probe.client.complete(key, {"model": probe.model, "prompt": [FILLER_TOKEN_ID] * 8, "max_tokens": 1})
    result.sent += 1
    if control.ok:
        cases = [
            ("prompt alone over", [FILLER_TOKEN_ID] * (context + 1), 1),
            ("prompt + max_tokens over", [FILLER_TOKEN_ID] * (context - max_tokens // 2), max_tokens),
        ]
        how = "token-id prompts"
    else:
        per = _tokens_per_sentence(probe, key)
        if per is None:
            report.skip(result, f"a short control prompt got HTTP {control.status}; cannot size prompts",
                        "over-length check skipped: the endpoint refused a short control prompt")
            return
        over = FILLER_SENTENCE * (math.ceil((context + 1) / per) + 2)
        cases = [("prompt alone over", over, 1)]
        how = "text prompts sized from usage.prompt_tokens"
    bad_code, clamped = 0, None
    for name, prompt, n in cases:
        reply = probe.client.complete(key, {"model": probe.model, "prompt": prompt, "max_tokens": n})
        result.sent += 1
        probe.canaries.scan(tenant, reply.text, "over_length")
        if 400 <= reply.status < 500:
            if reply.error_code != "context_length_exceeded":
                bad_code += 1
            continue
        if name == "prompt + max_tokens over" and _clamped(reply, context):
            # vLLM's way: the prompt fits, generation stops at the context
            # (finish_reason length, total_tokens <= context). Nothing past
            # the context was read or written: safe, and said as such.
            clamped = reply.total_tokens
            continue
        report.find(result, f"{name} (context {context:,}, max_tokens {n}) got {reply.failure}, not a 4xx")
    result.detail = f"context {context:,}; {len(cases)} over-length case(s) via {how}"
    if clamped is not None and result.status == "ok":
        result.status = "clamps"
        result.detail += (f"; prompt + max_tokens over got HTTP 200, finish_reason length, total_tokens "
                          f"{clamped:,} <= context: generation clamped at the context (safe)")
    if bad_code and result.status == "ok":
        result.detail += f"; {bad_code} 4xx without code context_length_exceeded"


def _tokens_per_sentence(probe: Probe, key: str) -> float | None:
    """Measure the filler sentence's token count from usage.prompt_tokens (no tokenizer needed)."""
    counts = []
    for n in (8, 16):
        reply = probe.client.complete(key, {"model": probe.model, "prompt": FILLER_SENTENCE * n, "max_tokens": 1})
        if not reply.ok or reply.prompt_tokens is None:
            return None
        counts.append(reply.prompt_tokens)
    per = (counts[1] - counts[0]) / 8
    return per if per > 0 else None


def coherence(probe: Probe, report: ProbeReport, context: int | None) -> None:
    """A prompt near the limit with a canary at its start must recall it at the end."""
    result = CheckResult("coherence")
    report.checks.append(result)
    if probe.args.skip_coherence:
        report.skip(result, "--skip-coherence")
        return
    if context is None and probe.args.max_context is None:
        report.skip(result, "no advertised context length; pass --max-context",
                    "coherence check skipped: no advertised context length")
        return
    tenant = probe.tenants[0]
    key = probe.tenant_keys[tenant]
    max_tokens = max(16, probe.args.max_tokens)
    target = probe.args.max_context or context
    if context is not None:
        target = min(target, context - max_tokens - 8)
    per = _tokens_per_sentence(probe, key)
    result.sent += 2
    canary = probe.canaries.new(tenant)
    head = f"The secret code is {canary}. Remember the secret code.\n"
    tail = "\nQuestion: What is the secret code?\nAnswer: The secret code is"
    base = 40  # head + tail, generously
    count = max(1, int((target - base) / (per or len(FILLER_SENTENCE) / 3)))
    reply = Reply(0)
    for _ in range(4):
        reply = probe.client.complete(key, probe._greedy(head + FILLER_SENTENCE * count + tail, max_tokens))
        result.sent += 1
        if not (400 <= reply.status < 500 and reply.error_code == "context_length_exceeded"):
            break
        count = int(count * 0.8)  # our size estimate was over the limit: shrink and retry
    probe.canaries.scan(tenant, reply.text, "coherence")
    size = f"{reply.prompt_tokens:,} prompt tokens" if reply.prompt_tokens else f"~{target:,} prompt tokens"
    if not reply.ok:
        report.find(result, f"coherence: failed: a {size} prompt within the limit got {reply.failure}")
    elif canary not in reply.text:
        report.find(result, f"coherence: failed: the model did not repeat the canary placed at the start of a "
                    f"{size} prompt (small models may fail this honestly; --skip-coherence to skip)")
    result.detail = f"{size}, canary at the start, asked for at the end"


def _clamped(reply: Reply, context: int) -> bool:
    """A 200 that stopped at the context: finish_reason length and no token past it."""
    return (reply.ok and reply.finish_reason == "length" and reply.total_tokens is not None
            and reply.total_tokens <= context)
