"""Request state for the engine. Pure Python: ids and ints, no torch."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None = off; k >= 0 = sampled token plus top k
    logit_bias: tuple[tuple[int, float], ...] = ()
    # OpenAI's: subtracted from a token's logit once it appears in the output
    # (presence) and per time it appears (frequency); each in [-2, 2].
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # vLLM's: a token seen in the prompt or the output has its logit divided
    # by this when positive, multiplied when negative; 1 = off.
    repetition_penalty: float = 1.0
    # echo with logprobs: each prompt token's logprob plus its top k. On,
    # prefill computes every prompt row's logits (off: the sampling row's
    # only) and bypasses the prefix cache (a cached page has no logits).
    prompt_logprobs: int | None = None
    # Structured output: llguidance's grammar as text, not a matcher, so it travels
    # in the signed ticket and a decode worker rebuilds it (engine/grammar_mask.py).
    grammar: str | None = None

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # admitted, holds no pages (or was preempted and gave them back)
    RUNNING = "running"  # holds pages; prefilling or decoding
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens reached
    ABORT = "abort"  # client went away or cancelled
    ERROR = "error"  # the engine failed this request (fail closed)


@dataclass
class Request:
    request_id: str
    tenant: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival: int  # admission order; the newest is preempted first
    output_token_ids: list[int] = field(default_factory=list)
    # Positions [0, num_computed) have KV written in this request's pages:
    # the written watermark that attention may read below.
    num_computed: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    # Prefix-cache pages this request reads but does not own (pinned), and
    # the hash of each full page of its prompt (its cache keys).
    shared_pages: list[int] = field(default_factory=list)
    prefix_hashes: list[int] = field(default_factory=list)
    # Positions [0, charged) were charged to its tenant's fair-queue counter;
    # recomputing them after a preemption is not charged again.
    charged: int = 0
    # The digest of the LoRA adapter it runs under (AdapterRef.digest); None: the base model.
    adapter: str | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_at(self, index: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[index] if index < n else self.output_token_ids[index - n]

    @property
    def prefill_target(self) -> int:
        """Positions that prefill computes. A preempted request recomputes all
        but its last sampled token, which the next decode step feeds in."""
        return self.num_tokens - 1 if self.output_token_ids else self.num_tokens

    @property
    def decoding(self) -> bool:
        """All tokens but the last sampled one have KV: the next step is a decode step."""
        return self.status is RequestStatus.RUNNING and self.num_computed == self.num_tokens - 1 \
            and bool(self.output_token_ids)

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
