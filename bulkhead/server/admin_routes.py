"""The operator API for workers (`bulkhead admin` is its command-line client):

    GET  /admin/workers                 every worker: name, role, state, routes in flight
    POST /admin/workers/{name}/drain    body {"force": false}: assign it nothing more
    POST /admin/workers/{name}/resume   assign to it again

With keys on, an operator key only. An unknown worker is a 404
(worker_not_found), draining the last worker of a role without force a 409
(last_worker_of_role), a colocated server a 400 (no_workers).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from fastapi import FastAPI, Request

from bulkhead.errors import InvalidRequest
from bulkhead.serving.backend import Backend


def add_admin_routes(app: FastAPI, backend: Backend, operator_only: Callable[[Request], None]) -> None:
    @app.get("/admin/workers")
    async def workers(request: Request):
        operator_only(request)
        return {"workers": backend.worker_states()}

    @app.post("/admin/workers/{name}/drain")
    async def drain(name: str, request: Request):
        operator_only(request)
        force = (await _body(request)).get("force", False)
        if not isinstance(force, bool):
            raise InvalidRequest(f"force must be true or false, not {force!r}", param="force", value=str(force))
        return backend.drain(name, force=force)

    @app.post("/admin/workers/{name}/resume")
    async def resume(name: str, request: Request):
        operator_only(request)
        return backend.resume(name)


async def _body(request: Request) -> dict:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise InvalidRequest(f"the body is not JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body is a JSON object", code="invalid_json")
    return body
