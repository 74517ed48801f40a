"""The OpenAI-compatible HTTP API: the server's state and the app that routes to it.

Routes live one group per module: completion_routes.py (the OpenAI API),
inflight.py, operator_routes.py, admin_routes.py, dashboard.py, probes.py;
add_error_handlers answers every error in the OpenAI shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from bulkhead import __version__
from bulkhead.errors import BulkheadError, InvalidRequest
from bulkhead.seams import PRODUCTION, Seams
from bulkhead.server.admin_routes import add_admin_routes
from bulkhead.server.auth import DEFAULT_TENANT, KeyStore
from bulkhead.serving.backend import Backend
from bulkhead.server.body_limit import BodyLimit
from bulkhead.server.completion_routes import add_completion_routes
from bulkhead.server.dashboard import add_dashboard_routes, dashboard_view
from bulkhead.server.dashboard_history import FirstTokenTimes
from bulkhead.server.inflight import InFlightRequests, add_request_routes
from bulkhead.server.limiter import TenantLimiter
from bulkhead.lora.registry import AdapterRegistry
from bulkhead.server.metrics import KeyStoreCollector, Metrics
from bulkhead.server.operator_routes import add_operator_routes
from bulkhead.server.params import DEFAULT_MAX_TOKENS, schema_error
from bulkhead.server.probes import add_probe_routes
from bulkhead.server.response_counter import ResponseCounter
from bulkhead.server.responses import LogprobFormatter
from bulkhead.server.tenants import DEFAULT_POLICY

MAX_BODY_BYTES = 16 * 2**20


@dataclass
class ServerState:
    backend: Backend
    keys: KeyStore | None
    seams: Seams = PRODUCTION  # the admission function and extra counters a test harness may swap in
    # max_tokens of a request that names none; 0 = the rest of the context (params.DEFAULT_MAX_TOKENS says why not)
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    # True once the HTTP server was told to exit: /ready answers 503 (launch.py points it at uvicorn's flag)
    stopping: Callable[[], bool] = lambda: False
    # Each tenant's LoRA adapters (keys.toml [tenants.NAME.adapters]); None: keys are off, no adapters.
    adapters: AdapterRegistry | None = None

    def __post_init__(self) -> None:
        self.model_id = self.backend.model_id
        self.metrics = Metrics(self.backend.collector())
        if self.keys is not None:
            self.metrics.registry.register(KeyStoreCollector(self.keys))
        self.logprobs = LogprobFormatter(self.backend.tokenizer)
        self.first_tokens = FirstTokenTimes()  # /dashboard's TTFT plot: the last seconds' raw times
        self.inflight = InFlightRequests()  # by (tenant, id), for GET/DELETE /v1/requests/{id}
        policy_of = self.keys.policy if self.keys is not None else (lambda _t: DEFAULT_POLICY)
        self.limiter = TenantLimiter(policy_of, self.inflight)
        # The scheduler reads weights and KV shares through the key store, so a reload applies at once.
        self.backend.set_tenant_shares(lambda t: policy_of(t).weight, lambda t: policy_of(t).kv_share)

    def tenants_info(self) -> dict:
        """/server_info's view of the tenant table and each tenant's share (operator key only)."""
        keys = self.keys
        body: dict = {"table": {}, "reload_error": None, "live": self.backend.tenant_stats()}
        if keys is not None:
            keys.maybe_reload()
            body["table"] = {t: {k: v for k, v in vars(p).items() if v is not None} for t, p in keys.policies.items()}
            body["reload_error"] = keys.reload_error
            body["reload_failures"] = keys.reload_failures
            # True: keys.toml on disk cannot be read, and keys removed from it still authorise.
            body["keys_stale"] = keys.stale
        throttled: dict[str, dict[str, int]] = {}
        for (tenant, limit), n in sorted(self.limiter.throttled.items()):
            throttled.setdefault(tenant, {})[limit] = n
        body["throttled"] = throttled
        if self.adapters is not None:  # each tenant's LoRA adapters by name
            body["adapters"] = {t: self.adapters.names(t) for t in {a.tenant for a in self.adapters.loaded()}}
        return body


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="bulkhead", version=__version__)
    app.state.bulkhead = state
    backend = state.backend
    add_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    app.add_middleware(ResponseCounter, counter=state.metrics.responses)  # added last: outermost, sees BodyLimit's 413s

    def tenant_of(request: Request) -> str:
        tenant = DEFAULT_TENANT if state.keys is None else state.keys.tenant_for(request.headers.get("authorization"))
        request.state.tenant = tenant  # the key was valid: ResponseCounter may label the response with it
        return tenant

    def operator_only(request: Request) -> None:
        """With keys on, /metrics and /server_info name every tenant and its
        figures: an operator key opens them, a tenant's key gets a 403."""
        if state.keys is not None:
            state.keys.operator_for(request.headers.get("authorization"))

    add_probe_routes(app, backend, lambda: state.stopping())  # /health (liveness), /ready (readiness)
    add_admin_routes(app, backend, operator_only)  # /admin/workers: drain and resume
    # /dashboard: the page is open (it holds no figure); /dashboard/data is an operator's.
    add_dashboard_routes(app, lambda: dashboard_view(backend.info(), state.tenants_info()), operator_only,
                         state.first_tokens)
    add_operator_routes(app, state, operator_only)  # /server_info, /metrics, /metrics/fleet (vllm:* names)
    add_request_routes(app, state.inflight, tenant_of)  # /v1/requests/{id}
    add_completion_routes(app, state, tenant_of)  # /v1/models, /v1/completions, /v1/chat/completions
    return app


def add_error_handlers(app: FastAPI) -> None:
    """A BulkheadError with its own status, type, code and headers; a body
    failing the schema as a 400 naming the field; a body that is not UTF-8
    as a 400 naming the byte; any other HTTP error with its status."""
    def answer(err: BulkheadError, status: int | None = None) -> JSONResponse:
        return JSONResponse(err.to_dict(), status_code=status or err.status, headers=getattr(err, "headers", None))

    @app.exception_handler(BulkheadError)
    async def _typed(_: Request, e: BulkheadError):
        return answer(e)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError):
        return answer(schema_error(e.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException):
        if isinstance(e.__cause__, UnicodeDecodeError):  # FastAPI could not decode the body to parse it
            return answer(InvalidRequest(f"the body is not valid UTF-8: {e.__cause__.reason} at byte "
                                         f"{e.__cause__.start}", code="invalid_utf8"))
        err = BulkheadError(str(e.detail), code="not_found" if e.status_code == 404 else "http_error")
        err.type = "invalid_request_error" if e.status_code < 500 else "server_error"
        return answer(err, e.status_code)
