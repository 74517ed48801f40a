"""Liveness and readiness, as Kubernetes probes read them.

    GET /health   liveness: 200 {"status": "ok"} whenever the HTTP loop
                  answers. It never depends on the workers or the lineage
                  log: a livenessProbe that failed on those would restart a
                  process that a restart cannot mend (a full disk, a drained
                  decode worker) and lose the lineage records it still holds.
    GET /ready    readiness: 200 {"status": "ready"} while a new request can
                  be served; 503 in the OpenAI error shape (code "not_ready")
                  naming every reason otherwise: the server is shutting
                  down, no prefill/decode pair takes requests (the backend's
                  `not_ready()`), a lineage log cannot be written.

Both are open without a key, like a load balancer's probe: the reasons name
workers, files and errors, never a tenant.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from bulkhead.errors import BulkheadError
from bulkhead.serving.backend import Backend

SHUTTING_DOWN = "the server is shutting down: it finishes the requests it holds and takes no new ones"


class NotReady(BulkheadError):
    status = 503
    type = "server_error"
    code = "not_ready"

    def __init__(self, reasons: list[str]):
        super().__init__("not ready: " + "; ".join(reasons))
        self.reasons = reasons

    def to_dict(self) -> dict:
        body = super().to_dict()
        body["error"]["reasons"] = self.reasons
        return body


def add_probe_routes(app: FastAPI, backend: Backend, stopping: Callable[[], bool]) -> None:
    """stopping: True once the HTTP server was told to exit (SIGTERM)."""

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        reasons = ([SHUTTING_DOWN] if stopping() else []) + backend.not_ready()
        if reasons:
            raise NotReady(reasons)  # error_handlers.py answers it in the OpenAI shape
        return {"status": "ready"}
