"""Real engines (scheduler, runner, ledger, pool, sampler) over the canary model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bulkhead.engine.admission import Limits
from bulkhead.engine.builder import BuiltEngine, EngineConfig
from bulkhead.engine.engine import Engine
from bulkhead.engine.runner import ModelRunner, RunnerConfig
from bulkhead.engine.sampler import Sampler
from bulkhead.engine.scheduler import Scheduler, SchedulerConfig
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.ledger import PageLedger
from bulkhead.kv.pool import KVPool, scrub_released
from bulkhead.sim.canary_model import CanaryModel

MODEL_ID = "sim-canary"
VOCAB = 512  # canaries are token ids; the eos id stays out of their range
EOS = 2


@dataclass(frozen=True)
class SimGeometry:
    page_size: int = 4
    prefill_pages: int = 12
    decode_pages: int = 10
    model_context: int = 64  # the model's own limit; each worker clamps to its pool
    prefill_chunk: int = 12  # longer prompts take two prefill steps: chunked prefill is exercised
    # A chunk over this runs a layer a step (whole_pass_tokens too: whoever
    # waits), so passes in flight across steps (bulkhead.engine.pass_slices)
    # meet every fault the simulator injects.
    slice_tokens: int = 6
    decode_tile: int = 4

    @property
    def layout(self) -> KVLayout:
        return KVLayout(num_layers=2, num_kv_heads=1, head_dim=2, page_size=self.page_size, dtype="float32")


class CanaryTokenizer:
    """Enough of a tokenizer for the output tracker: ids become visible text."""

    vocab_size = VOCAB

    def decode(self, ids) -> str:
        return "".join(f"<{i}>" for i in ids)


def build_sim_engine(geo: SimGeometry, num_pages: int, worker: str, on_bad_read, prefill_only: bool,
                     pool: KVPool | None = None) -> BuiltEngine:
    """pool: decode's, owned by the simulated transfer target (as tcp's receiver owns it)."""
    layout = geo.layout
    pool = pool or KVPool(layout, num_pages, "zero")
    ledger = PageLedger(num_pages)
    context = min(geo.model_context, pool.num_tokens)  # --clamp-context-length
    config = EngineConfig(model_dir=Path("/nonexistent"), model_id=MODEL_ID, kv_memory_bytes=0,
                          page_size=geo.page_size, context_length=context, clamp_context_length=True,
                          max_running=8, prefill_chunk=geo.prefill_chunk, decode_tile=geo.decode_tile)
    scheduler = Scheduler(SchedulerConfig(page_size=geo.page_size, max_running=8, prefill_chunk=geo.prefill_chunk,
                                          num_layers=layout.num_layers, slice_tokens=geo.slice_tokens,
                                          whole_pass_tokens=geo.slice_tokens),
                          ledger, reclaim=lambda: scrub_released(pool, ledger), cache_secret=b"sim")
    runner = ModelRunner(CanaryModel(VOCAB, worker, on_bad_read), pool, ledger,
                         RunnerConfig(decode_tile=geo.decode_tile, safe_mode=True))
    tokenizer = CanaryTokenizer()
    engine = Engine(scheduler, runner, Sampler((EOS,)), pool, tokenizer, prefill_only=prefill_only)
    limits = Limits(context_length=context, pool_tokens=pool.num_tokens, page_size=geo.page_size, vocab_size=VOCAB)
    return BuiltEngine(engine, tokenizer, limits, config, clamped=context < geo.model_context, layout=layout)
