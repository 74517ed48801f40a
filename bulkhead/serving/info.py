"""The `/server_info` body of one engine: every live limit and setting.

Reported by the colocated backend and by every disaggregated worker, whose
router compares the pairing keys across workers.
"""

from __future__ import annotations

from typing import Any

from bulkhead import __version__
from bulkhead.kv.layout import K_PAGE_ORDER, POOL_ORDER
from bulkhead.kv.prefix_cache import CACHE_OWNER
from bulkhead.serving.memory import rss_bytes


# engine.builder.BuiltEngine, by name only (serving imports no engine): what
# engine_info and pool_bytes read of it is all they read.
BuiltEngine = Any


def _owned_by_tenant(ledger) -> dict[str, int]:
    """The ledger's count by tenant, read from the HTTP thread while the
    engine thread allocates: a table that changed size mid-read is read again
    (ints only, as the Prometheus collector reads it)."""
    for _ in range(5):
        try:
            return ledger.owned_by_tenant()
        except RuntimeError:
            continue
    return {}


def engine_info(built: BuiltEngine, model_id: str, role: str) -> dict:
    ledger, limits, cfg = built.engine.ledger, built.limits, built.config
    cached = len(ledger.pages_of(CACHE_OWNER))
    return {
        "engine": "bulkhead",
        "version": __version__,
        "role": role,
        "model": model_id,
        "context_length": limits.context_length,
        "max_input_tokens": limits.max_input_tokens,
        "context_length_clamped": built.clamped,
        "pool_tokens": limits.pool_tokens,
        "page_size": limits.page_size,
        "num_pages": ledger.num_pages,
        "free_pages": ledger.num_free,
        "owned_pages": ledger.num_owned - cached,  # held by requests
        "cached_pages": cached,  # held by the tenant-scoped prefix cache
        "prefix_cache": cfg.prefix_cache,
        "dirty_pages": ledger.num_dirty,
        "pages_allocated_total": ledger.pages_allocated,
        "pages_scrubbed_total": built.engine.pool.pages_scrubbed,
        # Requests' and the prefix cache's pages, by tenant (/dashboard's pool picture; operators only).
        "owned_pages_by_tenant": _owned_by_tenant(ledger),
        "kv_dtype": built.layout.dtype,
        "kv_layout": {"num_layers": built.layout.num_layers, "num_kv_heads": built.layout.num_kv_heads,
                      "head_dim": built.layout.head_dim, "k_page_order": K_PAGE_ORDER,
                      "pool_order": POOL_ORDER},
        "vocab_size": limits.vocab_size,
        "scrub_mode": cfg.scrub_mode,
        "max_running_requests": cfg.max_running,
        "prefill_chunk": cfg.prefill_chunk,
        "step_token_budget": built.engine.scheduler.config.token_budget,
        "fair_queue": "vtc" if built.engine.scheduler.config.fair else "fcfs",
        "kv_quotas": built.engine.scheduler.config.kv_quotas,
        "decode_tile": cfg.decode_tile,
        "decode_row_multiple": built.decode_row_multiple,  # 0 = fixed tiles of decode_tile rows
        "linear_kernel": built.linear_kernel,
        "matmul_precision": built.matmul_precision,
        "lm_head_kernel": built.lm_head_kernel,
        "weights": built.weights_info,  # each tensor group's stored format and the kernel that runs it
        "decode_attention": built.decode_attention,
        "decode_glue": built.decode_glue,
        "prefill_attention": built.prefill_attention,
        "prefill_glue": built.prefill_glue,
        "batch_invariant": cfg.decode_tile > 0,
        "safe_mode": cfg.safe_mode and cfg.guards,
        # "off" only under --unsafe-no-guards (benchmark only): no scrub, digests or per-step checks.
        "guards": "on" if cfg.guards else "off",
        "max_n": limits.max_n,
        "sampling_defaults": built.sampling_defaults,
        "engine_failures": built.engine.stats.failures,
        "lineage": built.engine.lineage.stats(),  # None: no --lineage-log
        # This process's resident set and its KV pool (bulkhead.serving.memory).
        "memory": {"rss_bytes": rss_bytes(), "kv_pool_bytes": pool_bytes(built)},
    }


def pool_bytes(built: BuiltEngine) -> int:
    data = built.engine.pool.data
    return data.numel() * data.element_size()
