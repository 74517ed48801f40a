"""Small builders for engine tests that need no model."""

from __future__ import annotations

from bulkhead.engine.admission import Admitted
from bulkhead.engine.request import FinishReason, SamplingParams

FAKE_TOKEN = 7


def ticket(rid: str, prompt_len: int = 8, max_tokens: int = 4, tenant: str = "alpha", **params) -> Admitted:
    return Admitted(rid, tenant, tuple(range(10, 10 + prompt_len)), SamplingParams(max_tokens=max_tokens, **params),
                    context_length=4096)


def complete_step(s, plan) -> None:
    """Finish a planned step as the engine would, sampling FAKE_TOKEN
    everywhere, then scrub what was released and check every invariant."""
    ids = [w.request_id for w in plan.prefills if w.samples] + [w.request_id for w in plan.decode]
    for req in s.complete(plan, {i: FAKE_TOKEN for i in ids}):
        if len(req.output_token_ids) >= req.params.max_tokens:
            s.finish(req.request_id, FinishReason.LENGTH)
    s.ledger.mark_scrubbed(s.ledger.dirty_pages())
    s.check_integrity()
