"""`bulkhead plan`: will this model's KV pool hold the context it will advertise?

The check that would have stopped the incident before launch: a 1,048,576-token
context on workers whose pool held 681,280 tokens. Exit 0 when the pool holds
the context, 1 when it does not, 2 when the input cannot be used.
"""

from __future__ import annotations

import argparse
import json
import sys
from decimal import Decimal, InvalidOperation
from typing import Any

from bulkhead.audit.errors import PlanInputError
from bulkhead.audit.kv_arithmetic import CapacityPlan, PlanInputs, plan_capacity, resolve_kv_dtype
from bulkhead.audit.model_config import attention_layout, load_config
from bulkhead.audit.sizes import format_bytes, parse_memory_size

EXIT_HOLDS, EXIT_DOES_NOT_HOLD, EXIT_BAD_INPUT = 0, 1, 2

# SGLang's static fraction on an H100/H200-class accelerator is about this; a
# plan should be run with the fraction the deployment will really use.
DEFAULT_MEM_FRACTION = "0.9"
# Per rank, for activations, CUDA graphs and communication buffers that grow
# with batch size rather than with weights or KV. Stated, not measured.
DEFAULT_ACTIVATION_RESERVE = "2GiB"


def build_inputs(args: argparse.Namespace) -> PlanInputs:
    layout = attention_layout(load_config(args.model))
    context = args.context_length or layout.max_position_embeddings
    if context is None:
        raise PlanInputError("the config has no max_position_embeddings; pass --context-length")
    kv_dtype, kv_dtype_bytes = resolve_kv_dtype(args.kv_dtype, layout)
    try:
        fraction = Decimal(str(args.mem_fraction))
    except InvalidOperation as error:
        raise PlanInputError(f"--mem-fraction {args.mem_fraction!r} is not a number") from error
    return PlanInputs(
        layout=layout, tp=args.tp, mem_fraction=fraction, context_length=context, kv_dtype=kv_dtype,
        kv_dtype_bytes=kv_dtype_bytes, page_size=args.page_size,
        accelerator_memory_bytes=parse_memory_size(args.accelerator_memory, unit_required=True,
                                                   what="--accelerator-memory"),
        # A bare number is bytes here, as the flag's name says (docs/audit.md's example gives one).
        weights_bytes=parse_memory_size(args.weights_bytes, what="--weights-bytes"),
        activation_reserve_bytes=parse_memory_size(args.activation_reserve, unit_required=True,
                                                   what="--activation-reserve"))


def per_token_formula(plan: CapacityPlan) -> str:
    layout, inputs = plan.inputs.layout, plan.inputs
    if layout.is_mla:
        return (f"{layout.num_layers} layers x ({layout.kv_lora_rank} kv_lora_rank + "
                f"{layout.qk_rope_head_dim} qk_rope_head_dim) x {inputs.kv_dtype_bytes} B, not split by TP")
    heads_per_rank = plan.kv_bytes_per_token // (2 * layout.num_layers * layout.head_dim * inputs.kv_dtype_bytes)
    return (f"2 x {layout.num_layers} layers x {heads_per_rank} of {layout.num_kv_heads} KV heads per rank x "
            f"{layout.head_dim} head_dim x {inputs.kv_dtype_bytes} B")


def plan_as_dict(plan: CapacityPlan, context_source: str) -> dict[str, Any]:
    inputs, layout = plan.inputs, plan.inputs.layout
    return {
        "model_type": layout.model_type,
        "attention": layout.kind,
        "tp": inputs.tp,
        "kv_dtype": inputs.kv_dtype,
        "kv_bytes_per_token_per_rank": plan.kv_bytes_per_token,
        "accelerator_memory_bytes": inputs.accelerator_memory_bytes,
        "mem_fraction": str(inputs.mem_fraction),
        "usable_bytes_per_rank": plan.usable_bytes,
        "weights_bytes_per_rank": plan.weights_bytes_per_rank,
        "activation_reserve_bytes": inputs.activation_reserve_bytes,
        "kv_budget_bytes_per_rank": plan.kv_budget_bytes,
        "page_size": inputs.page_size,
        "pool_tokens_per_worker": plan.pool_tokens,
        "context_length": inputs.context_length,
        "context_source": context_source,
        "holds_context": plan.holds_context,
        "shortfall_tokens": plan.shortfall_tokens,
        "accelerator_memory_needed_bytes": plan.accelerator_memory_needed_bytes,
    }


def render_text(plan: CapacityPlan, context_source: str) -> str:
    inputs, layout = plan.inputs, plan.inputs.layout
    rows = [
        ("model", f"{layout.model_type} ({layout.kind}), tp={inputs.tp}, kv dtype {inputs.kv_dtype}"),
        ("KV bytes/token/rank", f"{plan.kv_bytes_per_token:,}  = {per_token_formula(plan)}"),
        ("usable memory/rank", f"{format_bytes(plan.usable_bytes)}  = {format_bytes(inputs.accelerator_memory_bytes)} x {inputs.mem_fraction}"),
        ("- weights/rank", f"{format_bytes(plan.weights_bytes_per_rank)}  = {inputs.weights_bytes:,} B / {inputs.tp}"),
        ("- activation reserve", format_bytes(inputs.activation_reserve_bytes)),
        ("= KV budget/rank", format_bytes(plan.kv_budget_bytes)),
        ("pool tokens/worker", f"{plan.pool_tokens:,}  (whole pages of {inputs.page_size})"),
        ("context length", f"{inputs.context_length:,}  ({context_source})"),
    ]
    if plan.holds_context:
        verdict = f"OK: the pool holds the context with {plan.pool_tokens - inputs.context_length:,} tokens to spare"
    else:
        verdict = (f"DOES NOT HOLD: {plan.shortfall_tokens:,} tokens short; a full-context request needs "
                   f"{format_bytes(plan.context_kv_bytes)} of KV per rank, i.e. at least "
                   f"{format_bytes(plan.accelerator_memory_needed_bytes)} accelerator memory at fraction "
                   f"{inputs.mem_fraction} (or more TP, a smaller KV dtype, or a smaller --context-length)")
    rows.append(("verdict", verdict))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def run_plan(args: argparse.Namespace) -> int:
    try:
        inputs = build_inputs(args)
        plan = plan_capacity(inputs)
    except PlanInputError as error:
        print(f"bulkhead plan: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    source = "--context-length" if args.context_length else "config max_position_embeddings"
    print(json.dumps(plan_as_dict(plan, source), indent=2) if args.json else render_text(plan, source))
    return EXIT_HOLDS if plan.holds_context else EXIT_DOES_NOT_HOLD
