"""What an engine says about a request, as plain data: no torch.

These values leave the engine thread (to the HTTP layer, and in a
disaggregated deployment over the wire to the router, as the payload of the
`Output` message), so they hold ints, floats, strings and bytes only; the
router process, which computes nothing, imports them without loading torch,
and the model checker's decode sends them too. bulkhead.engine.outputs
re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from bulkhead.errors import BulkheadError


@dataclass(frozen=True)
class TokenLogprobs:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob), best first


@dataclass(frozen=True)
class RequestOutput:
    """One update for one request: what is new since the last update."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprobs, ...]
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    error: BulkheadError | None = None
    # Prefill-only engines: the pages still holding the prompt's KV and the
    # sampler state, handed to the transfer.
    held_pages: tuple[int, ...] = ()
    sampler_state: bytes | None = None
    # With the first token of a request that asked for prompt logprobs: one
    # per prompt token after the first (the first has no context to be
    # predicted from; OpenAI and vLLM give it null).
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()
