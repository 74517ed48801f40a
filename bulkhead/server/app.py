"""The OpenAI-compatible HTTP API."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from bulkhead import __version__
from bulkhead.engine import legacy
from bulkhead.engine.admission import Admitted, Rejection, admit
from bulkhead.errors import BulkheadError, InvalidRequest, NotFound
from bulkhead.faults import Faults
from bulkhead.model.tokenizer import ChatTemplateError
from bulkhead.server.auth import DEFAULT_TENANT, KeyStore
from bulkhead.server.backend import Backend
from bulkhead.server.metrics import Metrics
from bulkhead.server.params import (
    chat_messages, completion_prompts, sampling_params, validate_common,
)
from bulkhead.server.responses import LogprobFormatter, envelope, sse, usage
from bulkhead.server.schemas import ChatCompletionRequest, CompletionRequest, _SamplingFields

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 2**20


@dataclass
class ServerState:
    backend: Backend
    keys: KeyStore | None

    def __post_init__(self) -> None:
        self.model_id = self.backend.model_id
        self.client = self.backend
        self.metrics = Metrics(self.backend.collector())
        self.logprobs = LogprobFormatter(self.backend.tokenizer)
        self.faults = Faults()  # test-only hooks; inert unless BULKHEAD_FAULTS_FILE is set


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="bulkhead", version=__version__)
    app.state.bulkhead = state
    backend = state.backend
    tok = backend.tokenizer
    metrics = state.metrics

    @app.exception_handler(BulkheadError)
    async def _typed(_: Request, e: BulkheadError):
        return JSONResponse(e.to_dict(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        err = InvalidRequest(f"{loc or 'body'}: {first.get('msg', 'invalid request')}", param=loc or None)
        return JSONResponse(err.to_dict(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException):
        err = BulkheadError(str(e.detail), code="not_found" if e.status_code == 404 else "http_error")
        err.type = "invalid_request_error" if e.status_code < 500 else "server_error"
        return JSONResponse(err.to_dict(), status_code=e.status_code)

    @app.middleware("http")
    async def _body_limit(request: Request, call_next):
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > MAX_BODY_BYTES:
            err = InvalidRequest(f"request body of {length} bytes exceeds {MAX_BODY_BYTES}", code="body_too_large",
                                 limit=MAX_BODY_BYTES, value=int(length))
            return JSONResponse(err.to_dict(), status_code=413)
        return await call_next(request)

    def tenant_of(request: Request) -> str:
        if state.keys is None:
            return DEFAULT_TENANT
        return state.keys.tenant_for(request.headers.get("authorization"))

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/server_info")
    async def info():
        body = backend.info()
        if state.faults.fired:  # test-only hooks that fired (never in production)
            body["faults_fired"] = {**body.get("faults_fired", {}), **state.faults.counters()}
        return body

    @app.get("/metrics")
    async def prom():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request):
        tenant_of(request)
        return {"object": "list", "data": [{
            "id": state.model_id, "object": "model", "created": 0, "owned_by": "bulkhead",
            "max_model_len": backend.limits.context_length,
        }]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        tenant = tenant_of(request)
        _check_model(body)
        limits = backend.limits
        validate_common(body, limits)
        prompts = completion_prompts(body, limits, tok.encode)
        return await _serve(request, body, tenant, prompts, limits, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        tenant = tenant_of(request)
        _check_model(body)
        limits = backend.limits
        validate_common(body, limits)
        try:
            text = tok.apply_chat_template(chat_messages(body))
        except ChatTemplateError as e:
            raise InvalidRequest(str(e), param="messages") from None
        return await _serve(request, body, tenant, [tok.encode(text)], limits, chat=True)

    def _check_model(body: _SamplingFields) -> None:
        if body.model is not None and body.model != state.model_id:
            raise NotFound(f"model {body.model!r} does not exist; this server serves {state.model_id!r}",
                           param="model", code="model_not_found")

    async def _serve(request: Request, body, tenant: str, prompts: list[list[int]], limits, chat: bool):
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        endpoint = "chat" if chat else "completions"
        tickets: list[Admitted] = []
        # Every choice is admitted before any is submitted: a request is
        # answered in full or refused in full.
        for pi, ids in enumerate(prompts):
            for j in range(body.n):
                params = sampling_params(body, len(ids), limits, j, backend.sampling_defaults)
                decision = admit(f"{rid}-{pi}-{j}", tenant, ids, params, limits, cache_salt=body.cache_salt)
                if isinstance(decision, Rejection) and state.faults.fire("legacy_admission"):
                    decision = legacy.stub_ticket(decision, ids, params, limits.context_length)  # test-only
                if isinstance(decision, Rejection):
                    metrics.rejections.labels(tenant, decision.error.code).inc()
                    metrics.requests.labels(tenant, endpoint, str(decision.error.status)).inc()
                    log.info("%s tenant=%s rejected: %s", rid, tenant, decision.error.code)
                    raise decision.error
                tickets.append(decision)
        prompt_tokens = sum(len(p) for p in prompts)
        metrics.tokens.labels(tenant, "prompt").inc(prompt_tokens)
        log.info("%s tenant=%s admitted prompts=%d prompt_tokens=%d n=%d max_tokens=%d", rid, tenant,
                 len(prompts), prompt_tokens, body.n, tickets[0].params.max_tokens)
        run = _Run(state, rid, tenant, endpoint, tickets, chat, prompt_tokens, body)
        if body.stream:
            return StreamingResponse(run.stream(), media_type="text/event-stream")
        return await run.collect(request)

    return app


class _Run:
    """One HTTP request's generation: streams chunks or collects one response."""

    def __init__(self, state: ServerState, rid, tenant, endpoint, tickets, chat, prompt_tokens, body):
        self.state, self.rid, self.tenant, self.endpoint = state, rid, tenant, endpoint
        self.tickets, self.chat, self.prompt_tokens, self.body = tickets, chat, prompt_tokens, body
        self.kind = "chat.completion" if chat else "text_completion"
        self.started = time.monotonic()
        self.first_token = False

    def _observe(self, out) -> None:
        m = self.state.metrics
        if out.token_ids:
            m.tokens.labels(self.tenant, "completion").inc(len(out.token_ids))
            if not self.first_token:
                self.first_token = True
                m.ttft.observe(time.monotonic() - self.started)

    def _done(self, status: int, completion_tokens: int) -> None:
        self.state.metrics.requests.labels(self.tenant, self.endpoint, str(status)).inc()
        log.info("%s tenant=%s finished status=%d completion_tokens=%d", self.rid, self.tenant, status,
                 completion_tokens)

    def _logprobs(self, items, offset=0):
        if not items:
            return None
        f = self.state.logprobs
        return f.chat(items) if self.chat else f.completion(items, offset)

    async def collect(self, request: Request):
        n = len(self.tickets)
        texts, reasons, lps, counts = [""] * n, [None] * n, [[] for _ in range(n)], [0] * n

        async def gather():
            async for i, out in self.state.client.generate(self.tickets):
                if out.error is not None:
                    raise out.error
                self._observe(out)
                texts[i] += out.text
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
            c = {"index": i, "finish_reason": reasons[i], "logprobs": self._logprobs(lps[i])}
            if self.chat:
                c["message"] = {"role": "assistant", "content": texts[i]}
            else:
                c["text"] = texts[i]
            choices.append(c)
        self._done(200, sum(counts))
        return envelope(self.kind, self.rid, self.state.model_id, choices, usage(self.prompt_tokens, sum(counts)))

    async def stream(self):
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        model = self.state.model_id
        counts = [0] * len(self.tickets)
        offsets = [0] * len(self.tickets)
        if self.chat:
            for i in range(len(self.tickets)):
                yield sse(envelope(kind, self.rid, model, [
                    {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                     "finish_reason": None}]))
        try:
            async for i, out in self.state.client.generate(self.tickets):
                if out.error is not None:
                    self._done(out.error.status, sum(counts))
                    yield sse(out.error.to_dict())
                    return
                self._observe(out)
                counts[i] = out.completion_tokens
                if not out.text and not out.finished and not out.logprobs:
                    continue
                choice = {"index": i, "logprobs": self._logprobs(list(out.logprobs), offsets[i]),
                          "finish_reason": out.finish_reason}
                offsets[i] += len(out.text)
                if self.chat:
                    choice["delta"] = {"content": out.text} if out.text else {}
                else:
                    choice["text"] = out.text
                yield sse(envelope(kind, self.rid, model, [choice]))
        except asyncio.CancelledError:
            self._done(499, sum(counts))
            raise
        except BulkheadError as e:  # headers are sent: the error goes in the stream
            self._done(e.status, sum(counts))
            yield sse(e.to_dict())
            return
        opts = self.body.stream_options
        if opts is not None and opts.include_usage:
            yield sse(envelope(kind, self.rid, model, [], usage(self.prompt_tokens, sum(counts))))
        self._done(200, sum(counts))
        yield sse("[DONE]")
