"""The engine's configuration, without torch: the launcher builds one for
each worker it starts (and sends it as JSON) without loading a model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bulkhead.kv.layout import DTYPE_BYTES
from bulkhead.model import kernel_names

GUARDS_OFF_WARNING = (
    "ISOLATION GUARDS OFF (--unsafe-no-guards, benchmark only): freed KV pages are not scrubbed, transfers are "
    "not digested, and steps skip the page-ownership and finite-logit checks. One tenant's KV can reach another's "
    "requests. Never serve real traffic like this."
)


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
    # The kernels: "auto" is the named module's pick for the weights' format
    # and this CPU (the linear layers': bulkhead.model.kernel_table's; their
    # "exact": oneDNN fp32 where this torch runs it, else F.linear).
    linear_kernel: str = "auto"
    decode_attention: str = "auto"  # bulkhead.model.decode_kernel
    decode_glue: str = "auto"  # bulkhead.model.decode_layers
    prefill_attention: str = "auto"  # bulkhead.model.prefill_attention
    prefill_glue: str = "auto"  # bulkhead.model.prefill_glue
    prefix_cache: bool = False
    # The scheduler's (SchedulerConfig says why each): tokens per step, fair
    # queueing (False: first come, first served, measurement only), KV
    # quotas, and the slice of layers a long pass runs per step (0: whole).
    step_tokens: int = 0
    fair: bool = True
    kv_quotas: bool = True
    slice_tokens: int = 64
    # Benchmark only (`--unsafe-no-guards`): False turns off the isolation
    # guards — scrub on free, transfer digests, the runner's per-step ownership
    # and finite-logit checks — so their cost can be measured. Never False
    # with more than one tenant (serve refuses it with API keys).
    guards: bool = True
    # The KV cache's element type: "auto" (bfloat16, builder.KV_DTYPE_AUTO),
    # "float32", "bfloat16" or "float16". Prefill and decode workers must
    # agree (the router's pairing gate compares kv_dtype).
    kv_dtype: str = "auto"
    # A lock file this engine's steps hold, where workers on one host take
    # turns with all its cores (bulkhead.engine.core_lease; `--role local`
    # names one). None = steps never wait.
    core_lease: str | None = None

    def __post_init__(self):
        if self.kv_dtype != "auto" and self.kv_dtype not in DTYPE_BYTES:
            raise ValueError(f"kv_dtype must be auto or one of {sorted(DTYPE_BYTES)}, not {self.kv_dtype!r}")
        for name, choices in (("linear_kernel", kernel_names.KERNELS),
                              ("decode_attention", kernel_names.DECODE_ATTENTION),
                              ("decode_glue", kernel_names.DECODE_GLUE),
                              ("prefill_attention", kernel_names.PREFILL_ATTENTION),
                              ("prefill_glue", kernel_names.PREFILL_GLUE)):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {choices}, not {getattr(self, name)!r}")
