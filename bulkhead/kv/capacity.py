"""The capacity gate (invariant 2). Pure Python.

A worker whose KV pool cannot hold its maximum context refuses to start; only
when the operator asks for it does it advertise what the pool holds instead.
This is the check that would have stopped a 1,048,576-token context from
being served on a 681,280-token pool.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)


class CapacityError(RuntimeError):
    pass


@dataclass(frozen=True)
class CapacityDecision:
    context_length: int  # what the server advertises
    pool_tokens: int
    clamped: bool


def gate_context_length(context_length: int, pool_tokens: int, clamp: bool) -> CapacityDecision:
    if context_length <= 0:
        raise CapacityError(f"--context-length must be positive, got {context_length}")
    if pool_tokens >= context_length:
        return CapacityDecision(context_length, pool_tokens, clamped=False)
    if not clamp:
        raise CapacityError(f"the KV pool holds {pool_tokens} tokens but the context length is {context_length}: "
                            f"one request could need more KV than exists. Raise --kv-memory, lower "
                            f"--context-length to at most {pool_tokens}, or pass --clamp-context-length to "
                            f"advertise {pool_tokens}.")
    log.warning("context length clamped from %d to %d tokens: the KV pool holds no more (--clamp-context-length)",
                context_length, pool_tokens)
    return CapacityDecision(pool_tokens, pool_tokens, clamped=True)
