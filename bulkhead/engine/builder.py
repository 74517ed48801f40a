"""Assemble a colocated engine from a model directory and its config."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from bulkhead.engine.admission import Limits
from bulkhead.engine.core_lease import CoreLease
from bulkhead.engine.engine import Engine
from bulkhead.engine.engine_parts import OWN_PARTS, EngineParts
from bulkhead.engine.runner import ModelRunner, RunnerConfig
from bulkhead.engine.grammar_mask import GrammarMasks
from bulkhead.engine.sampler import Sampler
from bulkhead.engine.scheduler import SchedulerConfig
from bulkhead.kv.capacity import gate_context_length
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.ledger import PageLedger
from bulkhead.kv.pool import KVPool, release_unscrubbed
from bulkhead.engine.engine_config import GUARDS_OFF_WARNING, EngineConfig  # noqa: F401  (re-exported)
from bulkhead.lineage.sink import NULL_SINK, LineageSink
from bulkhead.model import decode_kernel, linear_kernel, machine_cache, prefill_attention, prefill_glue
from bulkhead.model.config import ModelConfig, load_sampling_defaults
from bulkhead.model.weight_format import describe as describe_weights
from bulkhead.model.kernel_names import HEAD_PRECISION, MATMUL_PRECISION
from bulkhead.model.llama import LlamaModel
from bulkhead.model.prepared_weights import load_laid_out
from bulkhead.model.row_invariance import invariant_row_multiple
from bulkhead.model.tokenizer import Tokenizer
from bulkhead.serving.memory import release_freed_heap

log = logging.getLogger(__name__)


# Prefill row counts are rounded up to this with the oneDNN kernels
# (RunnerConfig.prefill_row_bucket); aten's and the C prompt kernels take any count.
PREFILL_ROW_BUCKET = 32
UNBUCKETED_KERNELS = ("aten", *linear_kernel.BF16_INPUT_PROMPTS)
# Decode kernels whose every output is one thread's fixed sum whatever the
# team's size (the C linear driver hands out whole output blocks, the C
# decode layers a (request, KV head) per thread): with the C decode layers
# and a row-by-row lm_head, a lone decode row may run on one thread and get
# the numbers it gets beside others (tests/engine/test_runner.py, bit for bit).
THREAD_COUNT_INVARIANT_DECODE = ("q4-i16in", "bf16")
# One thread pays off where one core's bandwidth keeps up with the weights a
# token reads (SmolLM2-135M: ~106M layer parameters); a ~1B model wants every core.
SINGLE_THREAD_MAX_LAYER_PARAMS = 300_000_000


def layer_params(mc: ModelConfig) -> int:
    """The decoder layers' matrix parameters: what a decode token streams."""
    attention = mc.hidden_size * mc.head_dim * (2 * mc.num_heads + 2 * mc.num_kv_heads)
    return mc.num_layers * (attention + 3 * mc.hidden_size * mc.intermediate_size)


def single_thread_decode_rows(kernel: str, head: str, decode_glue: str, params: int = 0) -> int:
    invariant = kernel in THREAD_COUNT_INVARIANT_DECODE and head in linear_kernel.ROW_BY_ROW_HEADS \
        and decode_glue == "c"
    return 1 if invariant and params <= SINGLE_THREAD_MAX_LAYER_PARAMS else 0


def prompts_share_passes(kernel: str, head: str, prefill_glue_choice: str) -> bool:
    """A step's prompt chunks may share one pass (RunnerConfig.batch_prompts)
    where every kernel a prompt row meets computes each row alone (the
    bf16-input prompt kernel, the C prompt glue, attention per sequence, a
    row-by-row lm_head; embedding and final RMSNorm are torch's row ops,
    shown bit for bit in tests/engine/test_runner.py)."""
    return kernel in linear_kernel.BF16_INPUT_PROMPTS and head in linear_kernel.ROW_BY_ROW_HEADS \
        and prefill_glue_choice == "c"


@dataclass
class BuiltEngine:
    engine: Engine
    tokenizer: Tokenizer
    limits: Limits
    config: EngineConfig
    clamped: bool
    layout: KVLayout
    decode_row_multiple: int = 0  # measured at start-up; 0 = tiles of config.decode_tile
    # What each "auto" resolved to (the lm_head's: bulkhead.model.linear_kernel.choose_head).
    linear_kernel: str = "aten"
    decode_attention: str = "torch"
    lm_head_kernel: str = "fp32"
    decode_glue: str = "torch"
    prefill_attention: str = "torch"
    prefill_glue: str = "torch"

    # Read here, so /server_info's body (bulkhead.serving.info, which imports no model) needs none.
    @property
    def matmul_precision(self) -> str:
        return f"{MATMUL_PRECISION[self.linear_kernel]}; {HEAD_PRECISION[self.lm_head_kernel]}"

    @property
    def sampling_defaults(self) -> dict:
        return load_sampling_defaults(self.config.model_dir)

    @functools.cached_property
    def weights_info(self) -> dict:
        """/server_info's `weights`, read once (a worker reports it every
        heartbeat); empty for a stand-in model with no directory (the simulator's)."""
        if not (Path(self.config.model_dir) / "config.json").exists():
            return {}
        return describe_weights(self.config.model_dir, self.linear_kernel, self.lm_head_kernel)


PoolFactory = Callable[[KVLayout, int, str], KVPool]


@dataclass(frozen=True)
class _Model:  # the model as loaded, and what each "auto" resolved to
    config: ModelConfig
    model: LlamaModel
    kernel: str
    head: str
    kv_dtype: str
    attention: str
    prompt_attention: str


def build_engine(cfg: EngineConfig, pool_factory: PoolFactory | None = None, prefill_only: bool = False,
                 seams: EngineParts = OWN_PARTS, lineage: LineageSink = NULL_SINK,
                 decode_only: bool = False) -> BuiltEngine:
    """pool_factory(layout, num_pages, scrub_mode): a pool over storage a
    transfer backend shares (decode role). prefill_only / decode_only: lay
    the weights out for prompts / decode kernels only (a decode worker's
    prompts are recomputes). seams: the scrub, scheduler and engine a
    harness may wrap. lineage: where the ledger, scrub, prefix cache and
    engine record what touches tenant KV (default: nowhere)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    m = _load_model(cfg, "prompts" if prefill_only else "decode" if decode_only else "both")
    mc = m.config
    layout = KVLayout(mc.num_layers, mc.num_kv_heads, mc.head_dim, cfg.page_size, m.kv_dtype)
    num_pages = layout.pages_for_budget(cfg.kv_memory_bytes)
    decision = _gate_context(cfg, mc, num_pages)  # before the pool is allocated: a misconfigured worker fails fast
    pool = (pool_factory or KVPool)(layout, num_pages, cfg.scrub_mode)
    ledger = PageLedger(num_pages, lineage)
    pool.lineage = lineage
    tokenizer = Tokenizer(cfg.model_dir)
    limits = Limits(context_length=decision.context_length, pool_tokens=pool.num_tokens, page_size=cfg.page_size,
                    vocab_size=mc.vocab_size)
    scheduler = _make_scheduler(cfg, mc, pool, ledger, seams)
    row_multiple = 0 if prefill_only else _decode_row_multiple(m.model, cfg)  # a prefill worker decodes nothing
    runner_config = RunnerConfig(decode_tile=cfg.decode_tile, decode_row_multiple=row_multiple,
                                 prefill_row_bucket=0 if m.kernel in UNBUCKETED_KERNELS else PREFILL_ROW_BUCKET,
                                 batch_prompts=prompts_share_passes(m.kernel, m.head, m.model.prefill_glue),
                                 safe_mode=cfg.safe_mode and cfg.guards,
                                 single_thread_decode_rows=single_thread_decode_rows(
                                     m.kernel, m.head, m.model.decode_glue, layer_params(mc)))
    lease = CoreLease(cfg.core_lease) if cfg.core_lease else None
    runner = ModelRunner(m.model, pool, ledger, runner_config, lease)
    sampler = Sampler(mc.eos_token_ids, GrammarMasks(tokenizer.to_json(), mc.vocab_size, mc.eos_token_ids))
    engine = seams.wrap_engine(Engine(scheduler, runner, sampler, pool, tokenizer,
                                      prefill_only=prefill_only, lease=lease))
    log.info(
        "KV pool: %d pages x %d tokens = %d tokens (%.1f MiB, %s, scrub=%s); context length %d; linear kernel %s; "
        "lm_head %s; decode attention %s; decode glue %s; prefill attention %s; prefill glue %s", num_pages,
        cfg.page_size, pool.num_tokens, num_pages * layout.bytes_per_page / 2**20, m.kv_dtype, cfg.scrub_mode,
        decision.context_length, m.kernel, m.head, m.attention, m.model.decode_glue, m.prompt_attention,
        m.model.prefill_glue,
    )
    if not cfg.guards:
        log.warning(GUARDS_OFF_WARNING)
    release_freed_heap()  # the fp32 weights and the layout's temporaries (bulkhead.serving.memory)
    return BuiltEngine(engine, tokenizer, limits, cfg, decision.clamped, layout, row_multiple, m.kernel,
                       m.attention, m.head, m.model.decode_glue, m.prompt_attention, m.model.prefill_glue)


def _load_model(cfg: EngineConfig, runs: str) -> _Model:
    """The weights laid out for the chosen kernels and the passes `runs`
    names (kernel_names.RUNS), and the attention and glue each "auto"
    resolves to on this machine."""
    dtype = getattr(torch, cfg.dtype)
    mc, laid_out, kernel, head = load_laid_out(cfg.model_dir, dtype, cfg.linear_kernel, runs=runs)
    kv_dtype = resolve_kv_dtype(cfg)
    attention = decode_kernel.choose(cfg.decode_attention, kv_dtype, mc.num_heads, mc.num_kv_heads, mc.head_dim,
                                     cfg.page_size)
    prompt_attention = prefill_attention.choose(cfg.prefill_attention, kernel, mc.head_dim)
    decode_glue = "torch" if runs == "prompts" else cfg.decode_glue  # no decode rows: no C decode layers
    model = LlamaModel(mc, laid_out, attention, decode_glue, prompt_attention,
                       prefill_glue.choose(cfg.prefill_glue, kernel, dtype))
    return _Model(mc, model, kernel, head, kv_dtype, attention, prompt_attention)


def _gate_context(cfg: EngineConfig, mc: ModelConfig, num_pages: int):
    """The context length the pool can hold (kv.capacity's gate), refused
    past the model's own maximum."""
    decision = gate_context_length(
        cfg.context_length or mc.max_position_embeddings, num_pages * cfg.page_size, cfg.clamp_context_length
    )
    if decision.context_length > mc.max_position_embeddings:
        raise ValueError(
            f"--context-length {decision.context_length} exceeds the model's "
            f"max_position_embeddings {mc.max_position_embeddings}"
        )
    return decision


def _make_scheduler(cfg: EngineConfig, mc: ModelConfig, pool: KVPool, ledger: PageLedger, seams: EngineParts):
    if cfg.guards:
        reclaim = lambda: seams.scrub(pool, ledger)  # noqa: E731
    else:
        reclaim = lambda: release_unscrubbed(ledger)  # noqa: E731
    return seams.make_scheduler(
        SchedulerConfig(page_size=cfg.page_size, max_running=cfg.max_running, prefill_chunk=cfg.prefill_chunk,
                        prefix_cache=cfg.prefix_cache, step_tokens=cfg.step_tokens, fair=cfg.fair,
                        kv_quotas=cfg.kv_quotas, num_layers=mc.num_layers, slice_tokens=cfg.slice_tokens),
        ledger,
        reclaim=reclaim,
        cache_secret=os.urandom(32),  # per process: cache keys mean nothing elsewhere
    )


# The KV cache's default element type: bf16 halves the bytes decode attention
# reads and doubles the tokens a KV budget holds; attention computes in fp32
# on the widened values. Against the exact fp32 model (bench/quality.py,
# docs/performance.md): 384/384 top-1, mean KL 4.1e-5 nats. `--kv-dtype float32` is exact.
KV_DTYPE_AUTO = "bfloat16"


def resolve_kv_dtype(cfg: EngineConfig) -> str:
    """The KV cache's element type: as asked, or KV_DTYPE_AUTO for "auto"."""
    return KV_DTYPE_AUTO if cfg.kv_dtype == "auto" else cfg.kv_dtype


def _decode_row_multiple(model, cfg: EngineConfig) -> int:
    """The row multiple decode batches are padded to and stay batch-invariant
    on this CPU (0: tiles of cfg.decode_tile), measured once per machine,
    kernel, threads and batch size, then read from bulkhead.model.machine_cache."""
    if not cfg.decode_tile or not cfg.measure_decode_rows:
        return 0
    w = model.weights
    name = machine_cache.key("decode-rows", model=machine_cache.model_identity(cfg.model_dir),
                             kernels=[type(x).__name__ for x in (w.layers[0].qkv, w.lm_head)],
                             decode_inputs=getattr(w.layers[0].qkv, "decode_inputs", None), dtype=str(model.dtype),
                             threads=torch.get_num_threads(), max_running=cfg.max_running)
    cached = machine_cache.read_json(name)
    with contextlib.nullcontext() if cached is not None else machine_cache.computing(name):
        cached = cached or machine_cache.read_json(name)  # another worker may have measured meanwhile
        if cached is not None:
            multiple, how = cached["multiple"], f"measured {cached['measured']}, read from {machine_cache.folder()}"
        else:
            log.info("decode: measuring which batch sizes are batch-invariant on this CPU (once per machine)")
            layer = w.layers[0]
            multiple = invariant_row_multiple([layer.qkv, layer.o, layer.gate_up, layer.down, w.lm_head],
                                              cfg.max_running, dtype=model.dtype)
            machine_cache.write_json(name, {"multiple": multiple, "measured": time.strftime("%Y-%m-%d %H:%M")})
            how = "measured now"
    if multiple is None:
        log.info("decode: no row count is batch-invariant on this CPU (%s); tiles of %d rows", how, cfg.decode_tile)
        return 0
    log.info("decode: batches padded to a multiple of %d rows (batch-invariant on this CPU, %s)", multiple, how)
    return multiple
