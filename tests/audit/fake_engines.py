"""Fake engines serving recorded response shapes over real loopback HTTP.

One uvicorn server on 127.0.0.1 (a free port) serves every fake engine under
its own path prefix, e.g. http://127.0.0.1:PORT/sglang-incident-prefill, so
tests also exercise engines that sit behind a path prefix.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse

ENGINE_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "audit" / "engines"

# engine name -> {path: fixture file}; the files are served verbatim.
ENGINES: dict[str, dict[str, str]] = {
    "sglang-incident-prefill": {"/server_info": "sglang-incident-prefill.server_info.json", "/v1/models": "sglang.models.json"},
    "sglang-incident-decode": {"/server_info": "sglang-incident-decode.server_info.json", "/v1/models": "sglang.models.json"},
    "sglang-fixed-prefill": {"/server_info": "sglang-fixed-prefill.server_info.json", "/v1/models": "sglang.models.json"},
    # Older SGLang: only /get_server_info, no /server_info alias.
    "sglang-fixed-decode-legacy": {"/get_server_info": "sglang-fixed-decode.server_info.json", "/v1/models": "sglang.models.json"},
    "vllm": {"/v1/models": "vllm.models.json", "/metrics": "vllm.metrics.txt"},
    "bulkhead-colocated": {"/server_info": "bulkhead-colocated.server_info.json"},
    "bulkhead-router": {"/server_info": "bulkhead-router.server_info.json"},
    "llamacpp": {"/props": "llamacpp.props.json", "/slots": "llamacpp.slots.json", "/v1/models": "llamacpp.models.json"},
    # llama-server --no-slots: /slots is not served (llama.cpp answers 501; 404 here), /props alone says it.
    "llamacpp-no-slots": {"/props": "llamacpp.props.json"},
    "not-an-engine": {"/": "vllm.models.json"},
}

# Engines that demand this bearer token, as SGLang and vLLM do with --api-key.
API_KEYS = {"bulkhead-colocated-keyed": "sk-audit-test"}
ENGINES["bulkhead-colocated-keyed"] = ENGINES["bulkhead-colocated"]


def make_app() -> FastAPI:
    app = FastAPI()

    @app.get("/{engine}/{path:path}")
    def serve(engine: str, path: str, request: Request):
        routes = ENGINES.get(engine)
        if routes is None or f"/{path}" not in routes:
            raise HTTPException(status_code=404)
        key = API_KEYS.get(engine)
        if key is not None and request.headers.get("authorization") != f"Bearer {key}":
            raise HTTPException(status_code=401)
        body = (ENGINE_FIXTURES / routes[f"/{path}"]).read_text(encoding="utf-8")
        if routes[f"/{path}"].endswith(".txt"):
            return PlainTextResponse(body, media_type="text/plain; version=0.0.4")
        return JSONResponse(json.loads(body))

    return app


class LoopbackServer:
    """uvicorn in a daemon thread on 127.0.0.1; `base` is its root URL."""

    def __init__(self, app: FastAPI) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.base = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    def __enter__(self) -> LoopbackServer:
        self._thread.start()
        # Poll uvicorn's own readiness flag rather than sleeping a fixed time.
        for _ in range(2000):
            if self._server.started:
                return self
            time.sleep(0.005)
        raise RuntimeError("fake engine server did not start")

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()

    def url(self, engine: str) -> str:
        return f"{self.base}/{engine}"


def closed_loopback_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
