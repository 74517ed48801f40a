"""Liveness and readiness, as Kubernetes probes read them; open without a
key, like a load balancer's probe (the reasons name workers, files and
errors, never a tenant).

    GET /health   200 whenever the HTTP loop answers. Never depends on the
                  workers or the lineage log: a livenessProbe failing on
                  those would restart a process a restart cannot mend (a
                  full disk, a drained decode worker) and lose the lineage
                  records it still holds.
    GET /ready    200 while a new request can be served; else 503 in the
                  OpenAI error shape (code "not_ready") naming every reason:
                  shutting down, the backend's `not_ready()`.
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
    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        reasons = ([SHUTTING_DOWN] if stopping() else []) + backend.not_ready()
        if reasons:
            raise NotReady(reasons)  # app.add_error_handlers answers it in the OpenAI shape
        return {"status": "ready"}
