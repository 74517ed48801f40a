"""KV capacity arithmetic: bytes per token per rank, and pool tokens per worker.

Pure integer arithmetic over an AttentionLayout and a memory budget, so the
numbers can be checked by hand (tests/audit/test_kv_arithmetic.py does).

    kv bytes/token/rank  MHA/GQA: 2 (K and V) x layers x kv_heads_per_rank x head_dim x dtype bytes
                         MLA:         layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes
    kv budget/rank       floor(memory x mem_fraction) - ceil(weights / tp) - activation reserve
    pool tokens/worker   floor(kv budget / kv bytes per token), rounded down to whole pages

Every TP rank holds every token (for its share of heads), so the pool of one
rank is the pool of the worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

from bulkhead.audit.errors import PlanInputError
from bulkhead.audit.model_config import AttentionLayout

# Names engines and configs use for KV dtypes, mapped to bytes per element.
KV_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2,
    "float16": 2, "fp16": 2, "half": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int8": 1,
}  # fmt: skip

# What `--kv-dtype auto` means when the config names no dtype: the common
# serving default, said out loud in the plan's output.
FALLBACK_KV_DTYPE = "bfloat16"


def resolve_kv_dtype(requested: str, layout: AttentionLayout) -> tuple[str, int]:
    """(dtype name, bytes per element); `auto` follows the config's dtype, as SGLang and vLLM do."""
    name = requested.lower()
    if name == "auto":
        name = str(layout.config_dtype or FALLBACK_KV_DTYPE).lower()
    if name not in KV_DTYPE_BYTES:
        raise PlanInputError(f"unknown KV dtype {requested!r}; known: auto, {', '.join(sorted(KV_DTYPE_BYTES))}")
    return name, KV_DTYPE_BYTES[name]


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """KV heads one TP rank stores; heads are replicated when there are fewer heads than ranks."""
    if num_kv_heads >= tp:
        if num_kv_heads % tp:
            raise PlanInputError(f"{num_kv_heads} KV heads cannot be split evenly over tp={tp}")
        return num_kv_heads // tp
    if tp % num_kv_heads:
        raise PlanInputError(f"{num_kv_heads} KV heads cannot be replicated evenly over tp={tp}")
    return 1


def kv_bytes_per_token(layout: AttentionLayout, tp: int, dtype_bytes: int) -> int:
    """KV bytes one token costs on one TP rank."""
    if layout.is_mla:
        # The latent is shared by all heads, so every rank keeps all of it.
        return layout.num_layers * (layout.kv_lora_rank + layout.qk_rope_head_dim) * dtype_bytes
    heads = kv_heads_per_rank(layout.num_kv_heads, tp)
    return 2 * layout.num_layers * heads * layout.head_dim * dtype_bytes


@dataclass(frozen=True)
class PlanInputs:
    layout: AttentionLayout
    accelerator_memory_bytes: int  # per accelerator, as the vendor sells it
    weights_bytes: int  # whole model; each TP rank holds weights / tp
    tp: int
    mem_fraction: Decimal  # share of accelerator memory the engine may take for weights + KV
    context_length: int  # the context the deployment will advertise
    kv_dtype: str
    kv_dtype_bytes: int
    page_size: int  # pools are carved into whole pages; a partial page holds nothing
    activation_reserve_bytes: int  # per rank, for activations and graphs the fraction does not cover

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise PlanInputError(f"--tp must be at least 1, got {self.tp}")
        if not Decimal(0) < self.mem_fraction <= Decimal(1):
            raise PlanInputError(f"--mem-fraction must be in (0, 1], got {self.mem_fraction}")
        if self.page_size < 1:
            raise PlanInputError(f"--page-size must be at least 1, got {self.page_size}")
        if self.context_length < 1:
            raise PlanInputError(f"context length must be at least 1, got {self.context_length}")
        if self.accelerator_memory_bytes < 1:
            raise PlanInputError("--accelerator-memory must be positive")


@dataclass(frozen=True)
class CapacityPlan:
    inputs: PlanInputs
    kv_bytes_per_token: int  # per rank
    usable_bytes: int  # floor(memory x fraction), per rank
    weights_bytes_per_rank: int
    kv_budget_bytes: int  # per rank; negative when weights and reserve do not fit at all
    pool_tokens: int  # per worker (= per rank)

    @property
    def holds_context(self) -> bool:
        return self.pool_tokens >= self.inputs.context_length

    @property
    def shortfall_tokens(self) -> int:
        return max(0, self.inputs.context_length - self.pool_tokens)

    @property
    def context_kv_bytes(self) -> int:
        """Per-rank KV bytes for one full-context request, in whole pages."""
        page = self.inputs.page_size
        pages = -(-self.inputs.context_length // page)
        return pages * page * self.kv_bytes_per_token

    @property
    def accelerator_memory_needed_bytes(self) -> int:
        """Smallest accelerator memory, at this fraction, whose pool holds the context."""
        needed = self.context_kv_bytes + self.weights_bytes_per_rank + self.inputs.activation_reserve_bytes
        return math.ceil(Decimal(needed) / self.inputs.mem_fraction)


def plan_capacity(inputs: PlanInputs) -> CapacityPlan:
    per_token = kv_bytes_per_token(inputs.layout, inputs.tp, inputs.kv_dtype_bytes)
    usable = int(Decimal(inputs.accelerator_memory_bytes) * inputs.mem_fraction)
    weights_per_rank = -(-inputs.weights_bytes // inputs.tp)
    budget = usable - weights_per_rank - inputs.activation_reserve_bytes
    tokens = max(0, budget) // per_token
    pool = tokens // inputs.page_size * inputs.page_size
    return CapacityPlan(inputs, per_token, usable, weights_per_rank, budget, pool)
