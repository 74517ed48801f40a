"""Assemble a colocated engine from a model directory and its config."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from bulkhead.engine.admission import Limits
from bulkhead.engine.core_lease import CoreLease
from bulkhead.engine.engine import Engine
from bulkhead.engine.runner import ModelRunner, RunnerConfig
from bulkhead.engine.grammar_mask import GrammarMasks
from bulkhead.engine.sampler import Sampler
from bulkhead.engine.scheduler import SchedulerConfig
from bulkhead.kv.capacity import gate_context_length
from bulkhead.kv.layout import DTYPE_BYTES, KVLayout
from bulkhead.kv.ledger import PageLedger
from bulkhead.kv.pool import KVPool, release_unscrubbed
from bulkhead.lineage.sink import NULL_SINK, LineageSink
from bulkhead.model import decode_kernel, decode_layers, linear_kernel, prefill_attention, prefill_glue, weight_format
from bulkhead.model.llama import LlamaModel
from bulkhead.model.loader import load_weights
from bulkhead.model.row_invariance import invariant_row_multiple
from bulkhead.model.tokenizer import Tokenizer
from bulkhead.seams import PRODUCTION, Seams

log = logging.getLogger(__name__)

GUARDS_OFF_WARNING = (
    "ISOLATION GUARDS OFF (--unsafe-no-guards, benchmark only): freed KV pages are not scrubbed, transfers are "
    "not digested, and steps skip the page-ownership and finite-logit checks. One tenant's KV can reach another's "
    "requests. Never serve real traffic like this."
)


# Prefill row counts are rounded up to this with the oneDNN kernels, which
# cache a compiled kernel per row count (RunnerConfig.prefill_row_bucket);
# aten's and the C prompt kernel's (q4-bf16in, q4-i16in, bf16) take any count unpadded.
PREFILL_ROW_BUCKET = 32
UNBUCKETED_KERNELS = ("aten", *linear_kernel.BF16_INPUT_PROMPTS)


def prompts_share_passes(kernel: str, head: str, prefill_glue_choice: str) -> bool:
    """A step's prompt chunks may share one pass (RunnerConfig.batch_prompts):
    every kernel a prompt row meets computes each row alone by construction
    (the bf16-input prompt kernel, the C prompt glue, attention per
    sequence, a row-by-row lm_head), so stacking rows changes none of them;
    the embedding lookup and the final RMSNorm are torch's row ops, shown
    bit for bit on SmolLM2 (tests/engine/test_runner.py)."""
    return kernel in linear_kernel.BF16_INPUT_PROMPTS and head in linear_kernel.ROW_BY_ROW_HEADS \
        and prefill_glue_choice == "c"


@dataclass(frozen=True)
class EngineConfig:
    model_dir: Path
    model_id: str
    kv_memory_bytes: int
    page_size: int = 16
    context_length: int | None = None  # None = the model's max_position_embeddings
    clamp_context_length: bool = False
    scrub_mode: str = "zero"
    dtype: str = "float32"  # fp32: this CPU class has no fast bf16 matmul
    max_running: int = 32
    prefill_chunk: int = 512
    decode_tile: int = 16  # 0 = batch invariance off
    # Measure at start-up the smallest row multiple that keeps decode
    # batch-invariant (bulkhead.model.row_invariance); decode_tile is the
    # fallback when none is found.
    measure_decode_rows: bool = True
    safe_mode: bool = True
    threads: int | None = None
    # "auto": q4 decode over weights exactly on a 4-bit grid (the bundled
    # Q4_1 SmolLM2, a Q4_0 file), bf16 over weights stored in bf16, else
    # oneDNN fp32 where this torch build runs it, else F.linear
    # (bulkhead.model.linear_kernel).
    linear_kernel: str = "auto"
    # "auto": the C kernel that reads decode KV in place where it compiles
    # here, else torch (bulkhead.model.decode_kernel).
    decode_attention: str = "auto"
    # "auto": a decode step's layers in one C call where the linear kernel is
    # a q4 one (q4, q4-bf16in, q4-i16in, q4-bf16in-all) or bf16 and decode attention c, else
    # torch ops (bulkhead.model.decode_layers).
    decode_glue: str = "auto"
    # "auto": prompts' attention on bf16 dot products where their linear
    # layers round inputs to bf16 (q4-bf16in, q4-i16in, q4-bf16in-all, bf16), else fp32 SDPA
    # (bulkhead.model.prefill_attention).
    prefill_attention: str = "auto"
    # "auto": a prompt pass's norms, rotary and SiLU in C where it builds
    # here and the linear kernel is a reduced-precision one, else torch ops
    # (bulkhead.model.prefill_glue).
    prefill_glue: str = "auto"
    prefix_cache: bool = False
    # Tokens per step (decode rows + prefill chunks); 0 = one chunk beside a
    # full decode batch (SchedulerConfig.step_tokens).
    step_tokens: int = 0
    # Fair queueing across tenants (VTC); False = first come, first served.
    fair: bool = True
    # Per-tenant KV quotas decide preemption under page pressure.
    kv_quotas: bool = True
    # Benchmark only (`--unsafe-no-guards`): False turns off the isolation
    # guards — scrub on free, transfer digests, the runner's per-step ownership
    # and finite-logit checks — so their cost can be measured. Never False
    # with more than one tenant (serve refuses it with API keys).
    guards: bool = True
    # The KV cache's element type: "auto" (KV_DTYPE_AUTO below: bfloat16), "float32",
    # "bfloat16" or "float16". Prefill and decode workers must agree (the
    # router's pairing gate compares kv_dtype).
    kv_dtype: str = "auto"
    # A lock file this engine's steps hold, where workers on one host take
    # turns with all its cores (bulkhead.engine.core_lease; `--role local`
    # names one). None = steps never wait.
    core_lease: str | None = None
    # Fair order only: a less-served tenant's chunk and decode rows may run
    # between the layers of a long prefill pass (bulkhead.engine.engine).
    interject: bool = True

    def __post_init__(self):
        if self.kv_dtype != "auto" and self.kv_dtype not in DTYPE_BYTES:
            raise ValueError(f"kv_dtype must be auto or one of {sorted(DTYPE_BYTES)}, not {self.kv_dtype!r}")
        if self.linear_kernel not in linear_kernel.KERNELS:
            raise ValueError(f"linear_kernel must be one of {linear_kernel.KERNELS}, not {self.linear_kernel!r}")
        if self.decode_attention not in decode_kernel.CHOICES:
            raise ValueError(f"decode_attention must be one of {decode_kernel.CHOICES}, "
                             f"not {self.decode_attention!r}")
        if self.decode_glue not in decode_layers.CHOICES:
            raise ValueError(f"decode_glue must be one of {decode_layers.CHOICES}, not {self.decode_glue!r}")
        if self.prefill_attention not in prefill_attention.CHOICES:
            raise ValueError(f"prefill_attention must be one of {prefill_attention.CHOICES}, "
                             f"not {self.prefill_attention!r}")
        if self.prefill_glue not in prefill_glue.CHOICES:
            raise ValueError(f"prefill_glue must be one of {prefill_glue.CHOICES}, not {self.prefill_glue!r}")


@dataclass
class BuiltEngine:
    engine: Engine
    tokenizer: Tokenizer
    limits: Limits
    config: EngineConfig
    clamped: bool
    layout: KVLayout
    model_config: object  # bulkhead.model.config.ModelConfig
    decode_row_multiple: int = 0  # measured at start-up; 0 = tiles of config.decode_tile
    linear_kernel: str = "aten"  # what "auto" resolved to
    decode_attention: str = "torch"  # what "auto" resolved to
    lm_head_kernel: str = "fp32"  # bulkhead.model.linear_kernel.choose_head's answer
    decode_glue: str = "torch"  # what "auto" resolved to (LlamaModel.decode_glue)
    prefill_attention: str = "torch"  # what "auto" resolved to
    prefill_glue: str = "torch"  # what "auto" resolved to


PoolFactory = Callable[[KVLayout, int, str], KVPool]


def build_engine(cfg: EngineConfig, pool_factory: PoolFactory | None = None, prefill_only: bool = False,
                 seams: Seams = PRODUCTION, lineage: LineageSink = NULL_SINK) -> BuiltEngine:
    """pool_factory(layout, num_pages, scrub_mode) builds the pool over storage a
    transfer backend shares with the prefill worker (decode role). seams:
    the scrub, scheduler and engine a test harness may wrap (bulkhead/seams.py).
    lineage: where the ledger, the scrub, the prefix cache and the engine
    record what touches tenant KV (bulkhead.lineage; default: nowhere)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    dtype = getattr(torch, cfg.dtype)
    mc, weights = load_weights(cfg.model_dir, dtype)
    kernel = linear_kernel.choose(cfg.linear_kernel, dtype, weights, weight_format.linear_format(cfg.model_dir))
    head = linear_kernel.choose_head(kernel, weights.lm_head)
    kv_dtype = resolve_kv_dtype(cfg)
    attention = decode_kernel.choose(cfg.decode_attention, kv_dtype, mc.num_heads, mc.num_kv_heads, mc.head_dim,
                                     cfg.page_size)
    prompt_attention = prefill_attention.choose(cfg.prefill_attention, kernel, mc.head_dim)
    model = LlamaModel(mc, linear_kernel.prepare(weights, kernel, head), attention, cfg.decode_glue, prompt_attention,
                       prefill_glue.choose(cfg.prefill_glue, kernel, dtype))
    del weights  # the laid-out copies replace them
    layout = KVLayout(mc.num_layers, mc.num_kv_heads, mc.head_dim, cfg.page_size, kv_dtype)
    num_pages = layout.pages_for_budget(cfg.kv_memory_bytes)
    # The gate runs before the pool is allocated: a misconfigured worker fails fast.
    decision = gate_context_length(
        cfg.context_length or mc.max_position_embeddings, num_pages * cfg.page_size, cfg.clamp_context_length
    )
    if decision.context_length > mc.max_position_embeddings:
        raise ValueError(
            f"--context-length {decision.context_length} exceeds the model's "
            f"max_position_embeddings {mc.max_position_embeddings}"
        )
    pool = (pool_factory or KVPool)(layout, num_pages, cfg.scrub_mode)
    ledger = PageLedger(num_pages, lineage)
    pool.lineage = lineage
    tokenizer = Tokenizer(cfg.model_dir)
    limits = Limits(
        context_length=decision.context_length,
        pool_tokens=pool.num_tokens,
        page_size=cfg.page_size,
        vocab_size=mc.vocab_size,
    )
    if cfg.guards:
        reclaim = lambda: seams.scrub(pool, ledger)  # noqa: E731
    else:
        reclaim = lambda: release_unscrubbed(ledger)  # noqa: E731
    scheduler = seams.make_scheduler(
        SchedulerConfig(page_size=cfg.page_size, max_running=cfg.max_running, prefill_chunk=cfg.prefill_chunk,
                        prefix_cache=cfg.prefix_cache, step_tokens=cfg.step_tokens, fair=cfg.fair,
                        kv_quotas=cfg.kv_quotas),
        ledger,
        reclaim=reclaim,
        cache_secret=os.urandom(32),  # per process: cache keys mean nothing elsewhere
    )
    row_multiple = _decode_row_multiple(model, cfg)
    runner_config = RunnerConfig(decode_tile=cfg.decode_tile, decode_row_multiple=row_multiple,
                                 prefill_row_bucket=0 if kernel in UNBUCKETED_KERNELS else PREFILL_ROW_BUCKET,
                                 batch_prompts=prompts_share_passes(kernel, head, model.prefill_glue),
                                 safe_mode=cfg.safe_mode and cfg.guards)
    lease = CoreLease(cfg.core_lease) if cfg.core_lease else None
    runner = ModelRunner(model, pool, ledger, runner_config, lease)
    sampler = Sampler(mc.eos_token_ids, GrammarMasks(tokenizer.to_json(), mc.vocab_size, mc.eos_token_ids))
    engine = seams.wrap_engine(Engine(scheduler, runner, sampler, pool, tokenizer,
                                      prefill_only=prefill_only, interject=cfg.interject, lease=lease))
    log.info(
        "KV pool: %d pages x %d tokens = %d tokens (%.1f MiB, %s, scrub=%s); context length %d; linear kernel %s; "
        "lm_head %s; decode attention %s; decode glue %s; prefill attention %s; prefill glue %s", num_pages,
        cfg.page_size, pool.num_tokens, num_pages * layout.bytes_per_page / 2**20, kv_dtype, cfg.scrub_mode,
        decision.context_length, kernel, head, attention, model.decode_glue, prompt_attention, model.prefill_glue,
    )
    if not cfg.guards:
        log.warning(GUARDS_OFF_WARNING)
    return BuiltEngine(engine, tokenizer, limits, cfg, decision.clamped, layout, mc, row_multiple, kernel, attention,
                       head, model.decode_glue, prompt_attention, model.prefill_glue)


# The KV cache's default element type. bf16 halves the bytes decode attention
# reads (the larger part of a 16-request step after the matmuls) and doubles
# the tokens a KV budget holds; attention still computes in fp32 on the
# widened values. Measured against the exact fp32 model (bench/quality.py,
# docs/performance.md): 384/384 top-1, mean KL 4.1e-5 nats with the default
# kernels, the README's answer unchanged. `--kv-dtype float32` is exact.
KV_DTYPE_AUTO = "bfloat16"


def resolve_kv_dtype(cfg: EngineConfig) -> str:
    """The KV cache's element type: as asked, or KV_DTYPE_AUTO for "auto"."""
    return KV_DTYPE_AUTO if cfg.kv_dtype == "auto" else cfg.kv_dtype


def _decode_row_multiple(model, cfg: EngineConfig) -> int:
    """Measure how decode batches can be padded and stay batch-invariant on
    this CPU (0 = use fixed tiles of cfg.decode_tile rows)."""
    if not cfg.decode_tile or not cfg.measure_decode_rows:
        return 0
    w = model.weights
    layer = w.layers[0]
    weights = [layer.qkv, layer.o, layer.gate_up, layer.down, w.lm_head]
    multiple = invariant_row_multiple(weights, cfg.max_running, dtype=model.dtype)
    if multiple is None:
        log.info("decode: no row count is batch-invariant on this CPU; tiles of %d rows", cfg.decode_tile)
        return 0
    log.info("decode: batches padded to a multiple of %d rows (measured batch-invariant on this CPU)", multiple)
    return multiple
