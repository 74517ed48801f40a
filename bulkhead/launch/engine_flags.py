"""The `serve` flags (bulkhead.server.serve_flags) as an EngineConfig."""

from __future__ import annotations

from pathlib import Path

from bulkhead.engine.engine_config import EngineConfig
from bulkhead.kv.layout import parse_memory


def engine_config(args, model_dir: Path, model_id: str, role: str | None = None) -> EngineConfig:
    """The engine of `role` (default args.role); --role local's workers each
    get their role's pool (--prefill-kv-memory, --decode-kv-memory)."""
    role = role or args.role
    # --precision exact is the fp32 reference everywhere: fp32 linears (the lm_head
    # too; prompt attention and glue then take torch's fp32 ops) and an fp32 KV cache.
    exact = args.precision == "exact"
    kv_memory = (getattr(args, f"{role}_kv_memory", None) if role in ("prefill", "decode") else None) or args.kv_memory
    return EngineConfig(
        model_dir=Path(model_dir), model_id=model_id, kv_memory_bytes=parse_memory(kv_memory),
        page_size=args.page_size, context_length=args.context_length,
        clamp_context_length=args.clamp_context_length, scrub_mode=args.scrub_mode, dtype=args.dtype,
        max_running=args.max_running, prefill_chunk=args.prefill_chunk, decode_tile=args.decode_tile,
        safe_mode=not args.no_safe_mode, threads=args.threads, linear_kernel="exact" if exact else args.linear_kernel,
        decode_attention=args.decode_attention, decode_glue=args.decode_glue,
        prefill_attention=args.prefill_attention, prefill_glue=args.prefill_glue,
        guards=not args.unsafe_no_guards, kv_dtype="float32" if exact else args.kv_dtype,
        step_tokens=args.step_tokens, fair=args.fairness == "vtc", kv_quotas=not args.no_kv_quotas,
        slice_tokens=0 if args.no_interjection else EngineConfig.slice_tokens,
        prefix_cache=args.prefix_cache == "on" or (args.prefix_cache == "auto" and role == "prefill"),
    )
