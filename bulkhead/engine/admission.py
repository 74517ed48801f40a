"""The one admission decision. Pure Python.

A request is admitted once, against the smallest limit of everything that will
hold its KV, before it gets a page. The answer is either an `Admitted` ticket
or a `Rejection`: a value of its own type that the scheduler refuses to queue.
"""

from __future__ import annotations

from dataclasses import dataclass

from bulkhead.engine.request import SamplingParams
from bulkhead.errors import ContextLengthExceeded, InvalidRequest


@dataclass(frozen=True)
class Limits:
    """Live limits of a serving deployment; every one is in /server_info."""

    context_length: int  # advertised: prompt + max_tokens must fit in it
    pool_tokens: int  # what the KV pool holds in total
    page_size: int
    vocab_size: int
    max_n: int = 16  # completions per request (`n`)
    max_logprobs: int = 20  # top_logprobs cap, OpenAI's own

    @property
    def max_input_tokens(self) -> int:
        # At least one token must be generated.
        return self.effective_context - 1

    @property
    def effective_context(self) -> int:
        return min(self.context_length, self.pool_tokens)


@dataclass(frozen=True)
class AdapterRef:
    """The tenant's LoRA adapter a request runs under (bulkhead.lora): its
    name, where its files are, and the digest of the weights it was admitted
    with. A worker loads the files and refuses the request when they hash to
    another digest."""

    name: str
    path: str
    digest: str


@dataclass(frozen=True)
class Admitted:
    request_id: str
    tenant: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    # Which limits the decision used, so a worker can re-check (never re-decide).
    context_length: int
    # The client's prefix-cache salt: subdivides the tenant's cache space only.
    cache_salt: str | None = None
    # The client's X-Request-Id, if it sent one: decides nothing; the lineage
    # log records it so `bulkhead lineage request` finds the request by it.
    client_id: str | None = None
    # The tenant's adapter the request runs under; None: the base model.
    adapter: AdapterRef | None = None


@dataclass(frozen=True)
class Rejection:
    request_id: str
    tenant: str
    error: InvalidRequest


def admit(request_id: str, tenant: str, prompt_token_ids: list[int] | tuple[int, ...], params: SamplingParams,
          limits: Limits, cache_salt: str | None = None) -> Admitted | Rejection:
    n, limit, most = len(prompt_token_ids), limits.effective_context, limits.max_input_tokens
    bad = [t for t in prompt_token_ids if not 0 <= t < limits.vocab_size]
    if n == 0:
        error = InvalidRequest("the prompt is empty", param="prompt", code="empty_prompt")
    elif n > most:
        error = ContextLengthExceeded(
            f"This model's maximum context length is {limit} tokens and at least one must be generated, so a "
            f"prompt may hold {most}; the prompt has {n} tokens.", param="prompt", limit=most, value=n)
    elif n + params.max_tokens > limit:
        error = ContextLengthExceeded(
            f"This model's maximum context length is {limit} tokens; you requested {n + params.max_tokens} tokens "
            f"({n} in the prompt, {params.max_tokens} for the completion). Reduce the prompt or max_tokens.",
            param="max_tokens", limit=limit, value=n + params.max_tokens)
    elif bad:
        error = InvalidRequest(f"token id {bad[0]} is outside the vocabulary [0, {limits.vocab_size})",
                               param="prompt", code="invalid_token_id", limit=limits.vocab_size - 1, value=bad[0])
    else:
        return Admitted(request_id, tenant, tuple(prompt_token_ids), params, limits.context_length, cache_salt)
    return Rejection(request_id, tenant, error)
