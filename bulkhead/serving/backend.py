"""What the HTTP layer serves from: a local engine, or a disaggregated cluster.
Torch-free: the router process implements it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from bulkhead.errors import InvalidRequest
from bulkhead.protocol.outputs import RequestOutput

if TYPE_CHECKING:
    from bulkhead.serving.fleet_metrics import FleetFigures

# The engine's and the model's types, by name only: this package sits below both.
Limits = Any  # bulkhead.engine.admission.Limits
Admitted = Any  # bulkhead.engine.admission.Admitted
Tokenizer = Any  # bulkhead.model.tokenizer.Tokenizer


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

    def not_ready(self) -> list[str]:
        """Why a new request cannot be served now (an empty list: it can):
        /ready answers 503 naming these (bulkhead/server/probes.py). Called
        on the event loop, so it only reads state; it names no tenant."""
        return []

    def tenant_stats(self) -> dict[str, dict]:
        """Per-tenant fair-share state: the engine's (colocated), or summed over
        the workers (a router, which queues nothing itself)."""
        return {}

    def fleet_figures(self) -> FleetFigures | None:
        """The whole server's queue, running requests and KV usage, for a
        fleet router in front (bulkhead.serving.fleet_metrics); None: no pool."""
        return None

    # -- workers (the operator API; a disaggregated router has them) ----------------
    def worker_states(self) -> list[dict]:
        raise _no_workers()

    def drain(self, name: str, force: bool = False) -> dict:
        raise _no_workers()

    def resume(self, name: str) -> dict:
        raise _no_workers()

    def set_tenant_shares(self, weight, kv_share) -> None:
        """Give the engine's scheduler the tenant table's weights and KV shares."""


def _no_workers():
    return InvalidRequest("this server runs colocated: it has no workers to list, drain or resume",
                          code="no_workers")
