"""The OpenAI-compatible HTTP API."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from bulkhead import __version__
from bulkhead.engine.admission import AdapterRef, Admitted, Rejection
from bulkhead.errors import BulkheadError, InvalidRequest, RateLimited
from bulkhead.model.tokenizer import ChatTemplateError
from bulkhead.seams import PRODUCTION, Seams
from bulkhead.server.admin_routes import add_admin_routes
from bulkhead.server.auth import DEFAULT_TENANT, KeyStore
from bulkhead.serving.backend import Backend
from bulkhead.server.body_limit import BodyLimit
from bulkhead.server.dashboard import add_dashboard_routes, dashboard_view
from bulkhead.server.dashboard_history import FirstTokenTimes
from bulkhead.server.fleet_routes import add_fleet_routes
from bulkhead.server.inflight import InFlight, InFlightRequests, client_request_id, until_cancelled
from bulkhead.server.limiter import TenantLimiter
from bulkhead.lora.registry import AdapterRegistry
from bulkhead.server.metrics import KeyStoreCollector, Metrics
from bulkhead.server.model_names import model_list, resolve_model
from bulkhead.server.params import (
    DEFAULT_MAX_TOKENS, chat_messages, completion_prompts, prompt_only, sampling_params, schema_error,
    validate_common,
)
from bulkhead.server.probes import add_probe_routes
from bulkhead.server.request_routes import add_request_routes
from bulkhead.server.response_counter import ResponseCounter
from bulkhead.server.responses import LogprobFormatter, envelope, sse, usage
from bulkhead.server.schemas import ChatCompletionRequest, CompletionRequest
from bulkhead.server.structured import GrammarCompiler, request_grammar
from bulkhead.server.tool_stream import HeldChoice
from bulkhead.server.tools import ToolPlan, template_messages, tool_plan
from bulkhead.server.tenants import DEFAULT_POLICY

log = logging.getLogger(__name__)

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
        self.client = self.backend
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
    tok = backend.tokenizer
    metrics = state.metrics
    grammars = GrammarCompiler(tok, lambda: backend.limits.vocab_size)

    @app.exception_handler(BulkheadError)
    async def _typed(_: Request, e: BulkheadError):
        return JSONResponse(e.to_dict(), status_code=e.status, headers=getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError):
        err = schema_error(e.errors())
        return JSONResponse(err.to_dict(), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException):
        if isinstance(e.__cause__, UnicodeDecodeError):  # FastAPI could not decode the body to parse it
            err = InvalidRequest(f"the body is not valid UTF-8: {e.__cause__.reason} at byte {e.__cause__.start}",
                                 code="invalid_utf8")
            return JSONResponse(err.to_dict(), status_code=err.status)
        err = BulkheadError(str(e.detail), code="not_found" if e.status_code == 404 else "http_error")
        err.type = "invalid_request_error" if e.status_code < 500 else "server_error"
        return JSONResponse(err.to_dict(), status_code=e.status_code)

    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)
    app.add_middleware(ResponseCounter, counter=metrics.responses)  # added last: outermost, sees BodyLimit's 413s

    def tenant_of(request: Request) -> str:
        tenant = DEFAULT_TENANT if state.keys is None else state.keys.tenant_for(request.headers.get("authorization"))
        request.state.tenant = tenant  # the key was valid: ResponseCounter may label the response with it
        return tenant

    add_probe_routes(app, backend, lambda: state.stopping())  # /health (liveness), /ready (readiness)

    def operator_only(request: Request) -> None:
        """With keys on, /metrics and /server_info name every tenant and its
        figures: an operator key opens them, a tenant's key gets a 403."""
        if state.keys is not None:
            state.keys.operator_for(request.headers.get("authorization"))

    add_admin_routes(app, backend, operator_only)  # /admin/workers: drain and resume
    # /dashboard: the page is open (it holds no figure); /dashboard/data is an operator's.
    add_dashboard_routes(app, lambda: dashboard_view(backend.info(), state.tenants_info()), operator_only,
                         state.first_tokens)
    add_fleet_routes(app, metrics.registry, backend.fleet_figures, operator_only)  # vllm:* names, for a fleet router

    @app.get("/server_info")
    async def info(request: Request):
        operator_only(request)
        body = backend.info()
        body["tenants"] = state.tenants_info()
        if state.adapters is not None:
            body["adapters"] = state.adapters.info()
        if body["tenants"].get("keys_stale"):
            body["warnings"] = ["keys file unreadable: revocations written in it are NOT in force ("
                                + body["tenants"]["reload_error"] + ")"]
        if extra := state.seams.counters():  # a test harness's own counts (never in production)
            body["harness_counters"] = extra
        return body

    @app.get("/metrics")
    async def prom(request: Request):
        operator_only(request)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request):
        return model_list(tenant_of(request), state.model_id, backend.limits.context_length, state.adapters)

    add_request_routes(app, state.inflight, tenant_of)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        tenant = tenant_of(request)
        adapter = resolve_model(body.model, tenant, state.model_id, state.adapters)
        limits = backend.limits
        validate_common(body, limits)
        grammar = request_grammar(body, grammars)
        prompts = completion_prompts(body, limits, tok.encode)
        return await _serve(request, body, tenant, prompts, limits, chat=False, grammar=grammar, adapter=adapter)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        tenant = tenant_of(request)
        adapter = resolve_model(body.model, tenant, state.model_id, state.adapters)
        limits = backend.limits
        validate_common(body, limits)
        tools = tool_plan(body.tools, body.tool_choice, body.parallel_tool_calls)
        grammar = request_grammar(body, grammars, tools)
        native_tools = None
        if tools is not None and tok.template_knows_tools:
            native_tools = [{"type": "function", "function": f} for f in tools.functions]
        try:
            messages = template_messages(chat_messages(body), tools, tok.template_knows_tools)
            text = tok.apply_chat_template(messages, native_tools)
        except ChatTemplateError as e:
            raise InvalidRequest(str(e), param="messages") from None
        return await _serve(request, body, tenant, [tok.encode(text)], limits, chat=True, grammar=grammar,
                            tools=tools, adapter=adapter)

    async def _serve(request: Request, body, tenant: str, prompts: list[list[int]], limits, chat: bool,
                     grammar: str | None = None, tools: ToolPlan | None = None, adapter: AdapterRef | None = None):
        # rid names the engine's requests (unique server-wide); public_id is
        # what the client sees and addresses, unique only within its tenant.
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        client_id = client_request_id(request.headers.get("x-request-id"))
        public_id = client_id or rid
        endpoint = "chat" if chat else "completions"
        tickets: list[Admitted] = []
        # Every choice is admitted before any is submitted: a request is
        # answered in full or refused in full.
        for pi, ids in enumerate(prompts):
            for j in range(body.n):
                params = sampling_params(body, len(ids), limits, j, backend.sampling_defaults,
                                         state.default_max_tokens, grammar)
                decision = state.seams.admit(f"{rid}-{pi}-{j}", tenant, ids, params, limits,
                                             cache_salt=body.cache_salt)
                if isinstance(decision, Rejection):
                    metrics.rejections.labels(tenant, decision.error.code).inc()
                    metrics.requests.labels(tenant, endpoint, str(decision.error.status)).inc()
                    log.info("%s tenant=%s rejected: %s", rid, tenant, decision.error.code)
                    raise decision.error
                tickets.append(replace(decision, client_id=client_id, adapter=adapter))
        prompt_tokens = sum(len(p) for p in prompts)
        try:  # before anything is submitted: a refused request holds no page
            state.limiter.check(tenant, sum(len(t.prompt_token_ids) + t.params.max_tokens for t in tickets))
        except RateLimited as e:
            metrics.throttled.labels(tenant, e.param).inc()
            metrics.requests.labels(tenant, endpoint, str(e.status)).inc()
            log.info("%s tenant=%s throttled: %s", rid, tenant, e.param)
            raise
        entry = InFlight(public_id, tenant, endpoint, len(tickets), prompt_tokens, body.stream)
        state.inflight.add(entry)  # a duplicate id is refused here, before anything is submitted
        metrics.tokens.labels(tenant, "prompt").inc(prompt_tokens)
        log.info("%s tenant=%s id=%s admitted prompts=%d prompt_tokens=%d n=%d max_tokens=%d", rid, tenant,
                 public_id, len(prompts), prompt_tokens, body.n, tickets[0].params.max_tokens)
        run = _Run(state, rid, tenant, endpoint, tickets, chat, prompt_tokens, body, entry, tools)
        headers = {"X-Request-Id": public_id}
        if body.stream:
            # The background task is a backstop: a stream never started still leaves the registry.
            return StreamingResponse(run.stream(), media_type="text/event-stream", headers=headers,
                                     background=BackgroundTask(state.inflight.remove, entry))
        try:
            response = await run.collect(request)
        finally:  # whatever happened, the id is free again (a no-op after a normal end)
            entry.end("failed")
            state.inflight.remove(entry)
        if isinstance(response, dict):
            return JSONResponse(response, headers=headers)
        return response

    return app


class _Run:
    """One HTTP request's generation: streams chunks or collects one response."""

    def __init__(self, state: ServerState, rid, tenant, endpoint, tickets, chat, prompt_tokens, body,
                 entry: InFlight, tools: ToolPlan | None = None):
        self.state, self.rid, self.tenant, self.endpoint = state, rid, tenant, endpoint
        self.tickets, self.chat, self.prompt_tokens, self.body = tickets, chat, prompt_tokens, body
        self.entry = entry
        self.tools = tools  # an answer may be tool calls: parsed once whole, then sent
        self.kind = "chat.completion" if chat else "text_completion"
        # What the response names as its model: the adapter the request named, else the base model.
        self.model = tickets[0].adapter.name if tickets[0].adapter is not None else state.model_id
        self.started = time.monotonic()
        self.first_token = False
        # echo (completions): each choice's text starts with its prompt; with
        # logprobs, the prompt's tokens lead its logprobs (prefill computed them).
        self.echo = bool(getattr(body, "echo", False))
        tok = state.backend.tokenizer
        self.echo_texts = [tok.decode(list(t.prompt_token_ids)) if self.echo else "" for t in tickets]
        self.prompt_only = prompt_only(body)  # echo with max_tokens 0: the one sampled token is dropped

    def _outputs(self):
        """The backend's outputs for every choice; with prompt_only, each
        without its sampled token (a finished one ends for "length", as a
        completion of max_tokens 0 would)."""
        outputs = until_cancelled(self.state.client.generate(self.tickets), self.entry.cancelled)
        return _without_completion(outputs) if self.prompt_only else outputs

    def _observe(self, out) -> None:
        m = self.state.metrics
        self.entry.completion_tokens += len(out.token_ids)
        if out.token_ids:
            m.tokens.labels(self.tenant, "completion").inc(len(out.token_ids))
            if not self.first_token:
                self.first_token = True
                m.ttft.observe(elapsed := time.monotonic() - self.started)
                self.state.first_tokens.add(elapsed)

    def _done(self, status: int, completion_tokens: int) -> None:
        cancelled = self.entry.cancelled.is_set()
        self.entry.end("cancelled" if cancelled else {200: "finished", 499: "disconnected"}.get(status, "failed"))
        self.state.inflight.remove(self.entry)
        self.state.metrics.requests.labels(self.tenant, self.endpoint, str(status)).inc()
        log.info("%s tenant=%s finished status=%d completion_tokens=%d", self.rid, self.tenant, status,
                 completion_tokens)

    def _logprobs(self, items, offset=0):
        if not items:
            return None
        f = self.state.logprobs
        return f.chat(items) if self.chat else f.completion(items, offset)

    def _echoed_logprobs(self, i: int, prompt_lps, items) -> dict | None:
        """Choice i's first logprobs under echo: the prompt's, then the
        completion's from the end of the echoed prompt."""
        if self.tickets[i].params.logprobs is None:
            return None
        completion = self._logprobs(items, len(self.echo_texts[i]))
        return self.state.logprobs.echoed(list(self.tickets[i].prompt_token_ids), prompt_lps, completion)

    async def collect(self, request: Request):
        n = len(self.tickets)
        texts, reasons, lps, counts = [""] * n, [None] * n, [[] for _ in range(n)], [0] * n
        prompt_lps: list[tuple] = [()] * n

        async def gather():
            async for i, out in self._outputs():
                if out.error is not None:
                    raise out.error
                self._observe(out)
                texts[i] += out.text
                prompt_lps[i] = prompt_lps[i] or out.prompt_logprobs
                lps[i].extend(out.logprobs)
                counts[i] = out.completion_tokens
                if out.finished:
                    reasons[i] = out.finish_reason

        task = asyncio.create_task(gather())
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=0.5)
                if not task.done() and await request.is_disconnected():
                    task.cancel()  # the generator's cleanup aborts every choice
                    self._done(499, sum(counts))
                    return Response(status_code=499)
            task.result()
        except BulkheadError as e:
            self._done(e.status, sum(counts))
            raise
        choices = []
        for i in range(n):
            if self.echo:
                c = {"index": i, "finish_reason": reasons[i],
                     "logprobs": self._echoed_logprobs(i, prompt_lps[i], lps[i])}
                texts[i] = self.echo_texts[i] + texts[i]
            else:
                c = {"index": i, "finish_reason": reasons[i], "logprobs": self._logprobs(lps[i])}
            if self.chat:
                c["message"] = {"role": "assistant", "content": texts[i]}
                if self.tools is not None:
                    content, calls = self.tools.parse(texts[i])
                    if calls:
                        c["message"] = {"role": "assistant", "content": content,
                                        "tool_calls": [call.to_dict() for call in calls]}
                        c["finish_reason"] = "tool_calls"
            else:
                c["text"] = texts[i]
            choices.append(c)
        self._done(200, sum(counts))
        return envelope(self.kind, self.entry.request_id, self.model, choices,
                        usage(self.prompt_tokens, sum(counts)))

    async def stream(self):
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        model = self.model
        counts = [0] * len(self.tickets)
        offsets = [0] * len(self.tickets)
        echoed = [not self.echo] * len(self.tickets)  # the prompt goes out in a choice's first chunk
        held = [HeldChoice() for _ in self.tickets]  # with tools: each answer, until it is whole
        if self.chat:
            for i in range(len(self.tickets)):
                yield sse(envelope(kind, self.entry.request_id, model, [
                    {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                     "finish_reason": None}]))
        try:
            async for i, out in self._outputs():
                if out.error is not None:
                    self._done(out.error.status, sum(counts))
                    yield sse(out.error.to_dict())
                    return
                self._observe(out)
                counts[i] = out.completion_tokens
                if self.tools is not None:  # chat only, so never with echo (a completions field)
                    for chunk in held[i].take(out, i, self.tools, self._logprobs):
                        yield sse(envelope(kind, self.entry.request_id, model, [chunk]))
                    continue
                if not out.text and not out.finished and not out.logprobs and echoed[i]:
                    continue
                text = out.text
                if not echoed[i]:
                    echoed[i] = True
                    text = self.echo_texts[i] + text
                    logprobs = self._echoed_logprobs(i, out.prompt_logprobs, list(out.logprobs))
                    offsets[i] = len(self.echo_texts[i])
                else:
                    logprobs = self._logprobs(list(out.logprobs), offsets[i])
                choice = {"index": i, "logprobs": logprobs, "finish_reason": out.finish_reason}
                offsets[i] += len(out.text)
                if self.chat:
                    choice["delta"] = {"content": text} if text else {}
                else:
                    choice["text"] = text
                yield sse(envelope(kind, self.entry.request_id, model, [choice]))
        except asyncio.CancelledError:
            self._done(499, sum(counts))
            raise
        except BulkheadError as e:  # headers are sent: the error goes in the stream
            self._done(e.status, sum(counts))
            yield sse(e.to_dict())
            return
        opts = self.body.stream_options
        if opts is not None and opts.include_usage:
            yield sse(envelope(kind, self.entry.request_id, model, [], usage(self.prompt_tokens, sum(counts))))
        self._done(200, sum(counts))
        yield sse("[DONE]")


async def _without_completion(outputs):
    """Echo with max_tokens 0: each output without the token the engine
    sampled. Closing this closes `outputs` at once, whose cleanup aborts the
    engine's requests (as leaving it directly would)."""
    try:
        async for i, out in outputs:
            yield i, replace(out, token_ids=(), text="", logprobs=(), completion_tokens=0,
                             finish_reason="length" if out.finished and out.error is None else out.finish_reason)
    finally:
        await outputs.aclose()
