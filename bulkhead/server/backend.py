"""What the HTTP layer serves from: a local engine, or a disaggregated cluster.

A backend provides the tokenizer, the live limits (admission reads them on
every request), a `generate(tickets)` async iterator, the `/server_info`
body and a Prometheus collector for its own state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator

from bulkhead import __version__
from bulkhead.engine.admission import Admitted, Limits
from bulkhead.engine.builder import BuiltEngine
from bulkhead.engine.engine import RequestOutput
from bulkhead.engine.scheduler import TenantShares
from bulkhead.kv.layout import K_PAGE_ORDER, POOL_ORDER
from bulkhead.kv.prefix_cache import CACHE_OWNER
from bulkhead.model.config import load_sampling_defaults
from bulkhead.model.linear_kernel import MATMUL_PRECISION
from bulkhead.model.tokenizer import Tokenizer
from bulkhead.server.engine_client import AsyncEngineClient
from bulkhead.server.metrics import EngineCollector


class Backend(ABC):
    tokenizer: Tokenizer
    model_id: str
    sampling_defaults: dict = {}  # the model's generation_config.json temperature/top_p/top_k

    @property
    @abstractmethod
    def limits(self) -> Limits:
        """Live limits; raises Overloaded (503) when nothing can serve."""

    @abstractmethod
    def generate(self, tickets: list[Admitted]) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Serve admitted tickets; leaving the iterator early aborts them."""

    @abstractmethod
    def info(self) -> dict:
        """The /server_info body: every live limit."""

    @abstractmethod
    def collector(self):
        """A prometheus_client collector for the backend's own state."""

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def tenant_stats(self) -> dict[str, dict]:
        """Per-tenant fair-share state where this process schedules (colocated);
        a router schedules nothing yet (fair dispatch waits for the protocol rewrite)."""
        return {}

    def set_tenant_shares(self, weight, kv_share) -> None:
        """Give the engine's scheduler the tenant table's weights and KV shares."""


class LocalBackend(Backend):
    """One process: the engine thread runs beside the HTTP server."""

    def __init__(self, built: BuiltEngine, model_id: str, auth: str):
        self.built = built
        self.tokenizer = built.tokenizer
        self.model_id = model_id
        self.sampling_defaults = load_sampling_defaults(built.config.model_dir)
        self._auth = auth
        self._client = AsyncEngineClient(built.engine)

    @property
    def limits(self) -> Limits:
        return self.built.limits

    def generate(self, tickets):
        return self._client.generate(tickets)

    def collector(self):
        return EngineCollector(self.built.engine)

    def tenant_stats(self) -> dict[str, dict]:
        return self.built.engine.scheduler.tenant_stats()

    def set_tenant_shares(self, weight, kv_share) -> None:
        self.built.engine.scheduler.shares = TenantShares(weight=weight, kv_share=kv_share)

    def start(self) -> None:
        self.built.engine.start()

    def stop(self) -> None:
        self.built.engine.stop()

    def info(self) -> dict:
        body = engine_info(self.built, self.model_id, role="colocated") | {"auth": self._auth}
        if self.built.engine.faults.fired:
            body["faults_fired"] = self.built.engine.faults.counters()
        return body


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
        "kv_dtype": cfg.dtype,
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
        "matmul_precision": MATMUL_PRECISION[built.linear_kernel],
        "decode_attention": built.decode_attention,
        "batch_invariant": cfg.decode_tile > 0,
        "safe_mode": cfg.safe_mode and cfg.guards,
        # "off" only under --unsafe-no-guards (benchmark only): no scrub, digests or per-step checks.
        "guards": "on" if cfg.guards else "off",
        "max_n": limits.max_n,
        "sampling_defaults": load_sampling_defaults(cfg.model_dir),
        "engine_failures": built.engine.stats.failures,
    }
