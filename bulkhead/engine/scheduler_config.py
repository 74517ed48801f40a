"""The scheduler's configuration and what it reads of the tenant table."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerConfig:
    page_size: int
    # Requests holding pages at once: the largest decode batch.
    max_running: int = 32
    # Prompt tokens per prefill pass of one request; bounds how long one
    # prompt's pass delays everything else in its step.
    prefill_chunk: int = 512
    # Tokens (decode rows + prefill chunk tokens) one step may carry; 0 = one
    # full chunk beside a full decode batch. A step always carries at least
    # one chunk when a prompt waits, so prefill never starves.
    step_tokens: int = 0
    # Admitted requests waiting for pages; beyond it new ones get a 503.
    max_waiting: int = 1024
    # Reuse whole pages of a tenant's earlier prompts (tenant-scoped keys).
    prefix_cache: bool = False
    # Fair queueing across tenants (VTC); False = first come, first served,
    # kept only to measure what fairness costs (the scheduler picks its
    # PrefillOrder, prefill_order.py, from this once, at construction).
    fair: bool = True
    # Virtual-counter cost of a prompt token and of an output token (the
    # VTC paper's 1 and 2: an output token holds the batch for a whole step).
    prompt_token_cost: float = 1.0
    output_token_cost: float = 2.0
    # Per-tenant KV quotas when tenants compete for pages (kv_quota.py);
    # False = the newest request is preempted, whoever's it is.
    kv_quotas: bool = True
    num_layers: int = 1  # the unit a long pass is sliced in (pass_slices.py)
    # While another tenant has work, a chunk longer than this runs as slices
    # of layers each costing about this many tokens of a whole pass: the
    # longest another tenant's prompt or next token waits. A prompt waits out
    # the slice in progress when it came, planned before it came, so no rule
    # of who waits now can shorten it: 64, as decode_step_tokens, keeps the
    # light tenant's median under a flood within 2x alone on the default
    # deployment (128: 2.1x, issue 36). 0 = whole passes and decode batches.
    slice_tokens: int = 64
    # A decode batch costing more than this many tokens of a pass runs in
    # groups of rows, one a step (decode_rounds.py). 64: under an 80-token
    # prompt's own pass (issue 14's light tenant), so its wait stays under 2x alone.
    decode_step_tokens: int = 64
    # A chunk over this runs in slices even while its tenant is alone (a
    # prompt arriving mid-pass waits one slice); up to it, chunks run whole
    # when nobody else waits, so two 256-token prompts share one pass.
    whole_pass_tokens: int = 256

    def __post_init__(self) -> None:
        for name in ("page_size", "max_running", "prefill_chunk", "max_waiting", "num_layers"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if min(self.step_tokens, self.slice_tokens, self.decode_step_tokens) < 0:
            raise ValueError(f"step_tokens, slice_tokens and decode_step_tokens must be >= 0, got "
                             f"{self.step_tokens}, {self.slice_tokens}, {self.decode_step_tokens}")
        if self.prompt_token_cost < 0 or self.output_token_cost < 0:
            raise ValueError("token costs must be >= 0")

    @property
    def token_budget(self) -> int:
        return self.step_tokens or self.prefill_chunk + self.max_running


@dataclass(frozen=True)
class TenantShares:
    """What the scheduler reads about a tenant (from the tenant table):
    weight(t) > 0 for fair service, kv_share(t) a pool fraction or None for
    the fair share of active tenants."""

    weight: Callable[[str], float] = lambda _t: 1.0
    kv_share: Callable[[str], float | None] = lambda _t: None
