"""Small builders for engine tests that need no model."""

from __future__ import annotations

from bulkhead.engine.admission import Admitted
from bulkhead.engine.request import SamplingParams


def ticket(rid: str, prompt_len: int = 8, max_tokens: int = 4, tenant: str = "alpha", **params) -> Admitted:
    return Admitted(rid, tenant, tuple(range(10, 10 + prompt_len)), SamplingParams(max_tokens=max_tokens, **params),
                    context_length=4096)
