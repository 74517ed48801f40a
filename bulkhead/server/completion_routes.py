"""The OpenAI generation API: `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions`.

A request is validated, every choice admitted (a typed Rejection refuses the
whole request), the tenant's rate limits checked, and only then submitted:
answered in full or refused in full, a refused one holding no page.
generation_run.py streams or collects the answer. `model` names the base
model or one of the tenant's own LoRA adapters; another tenant's gets the
404 of a name that exists nowhere, so no answer says what another has loaded.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from bulkhead.engine.admission import AdapterRef, Admitted, Rejection
from bulkhead.errors import InvalidRequest, NotFound, RateLimited
from bulkhead.lora.registry import AdapterRegistry
from bulkhead.model.tokenizer import ChatTemplateError
from bulkhead.server.generation_run import GenerationRun
from bulkhead.server.inflight import InFlight, client_request_id
from bulkhead.server.params import chat_messages, completion_prompts, sampling_params, validate_common
from bulkhead.server.schemas import ChatCompletionRequest, CompletionRequest, _SamplingFields
from bulkhead.server.structured import GrammarCompiler, request_grammar
from bulkhead.server.tools import ToolPlan, template_messages, tool_plan

if TYPE_CHECKING:
    from bulkhead.server.app import ServerState

log = logging.getLogger("bulkhead.server.app")  # the request log, as before the split


def add_completion_routes(app: FastAPI, state: ServerState, tenant_of: Callable[[Request], str]) -> None:
    backend = state.backend
    tok = backend.tokenizer
    grammars = GrammarCompiler(tok, lambda: backend.limits.vocab_size)

    @app.get("/v1/models")
    async def models(request: Request):
        return model_list(tenant_of(request), state.model_id, backend.limits.context_length, state.adapters)

    def checked(request: Request, body: _SamplingFields):
        """The request's tenant (its key checked), the limits its fields were
        checked against, and the tenant's adapter its `model` names (None: the base model)."""
        tenant = tenant_of(request)
        adapter = resolve_model(body.model, tenant, state.model_id, state.adapters)
        limits = backend.limits
        validate_common(body, limits)
        return tenant, limits, adapter

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        tenant, limits, adapter = checked(request, body)
        grammar = request_grammar(body, grammars)
        prompts = completion_prompts(body, limits, tok.encode)
        return await _serve(state, request, body, tenant, prompts, limits, chat=False, grammar=grammar,
                            adapter=adapter)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        tenant, limits, adapter = checked(request, body)
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
        return await _serve(state, request, body, tenant, [tok.encode(text)], limits, chat=True, grammar=grammar,
                            tools=tools, adapter=adapter)


async def _serve(state: ServerState, request: Request, body, tenant: str, prompts: list[list[int]], limits,
                 chat: bool, grammar: str | None = None, tools: ToolPlan | None = None,
                 adapter: AdapterRef | None = None):
    # rid names the engine's requests (unique server-wide); public_id is
    # what the client sees and addresses, unique only within its tenant.
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    client_id = client_request_id(request.headers.get("x-request-id"))
    public_id = client_id or rid
    endpoint = "chat" if chat else "completions"
    tickets = [replace(t, adapter=adapter) for t in
               _admit_every_choice(state, rid, tenant, endpoint, body, prompts, limits, grammar, client_id)]
    _check_rate(state, rid, tenant, endpoint, tickets)  # before anything is submitted: a refused request holds no page
    prompt_tokens = sum(len(p) for p in prompts)
    entry = InFlight(public_id, tenant, endpoint, len(tickets), prompt_tokens, body.stream)
    state.inflight.add(entry)  # a duplicate id is refused here, before anything is submitted
    state.metrics.tokens.labels(tenant, "prompt").inc(prompt_tokens)
    log.info("%s tenant=%s id=%s admitted prompts=%d prompt_tokens=%d n=%d max_tokens=%d", rid, tenant,
             public_id, len(prompts), prompt_tokens, body.n, tickets[0].params.max_tokens)
    run = GenerationRun(state, rid, tenant, endpoint, tickets, chat, prompt_tokens, body, entry, tools)
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


def _admit_every_choice(state: ServerState, rid: str, tenant: str, endpoint: str, body, prompts: list[list[int]],
                        limits, grammar: str | None, client_id: str | None) -> list[Admitted]:
    """A ticket for every choice of every prompt, or the first Rejection's error raised."""
    tickets: list[Admitted] = []
    for pi, ids in enumerate(prompts):
        for j in range(body.n):
            params = sampling_params(body, len(ids), limits, j, state.backend.sampling_defaults,
                                     state.default_max_tokens, grammar)
            decision = state.seams.admit(f"{rid}-{pi}-{j}", tenant, ids, params, limits, cache_salt=body.cache_salt)
            if isinstance(decision, Rejection):
                state.metrics.rejections.labels(tenant, decision.error.code).inc()
                state.metrics.requests.labels(tenant, endpoint, str(decision.error.status)).inc()
                log.info("%s tenant=%s rejected: %s", rid, tenant, decision.error.code)
                raise decision.error
            tickets.append(decision if client_id is None else replace(decision, client_id=client_id))
    return tickets


def _check_rate(state: ServerState, rid: str, tenant: str, endpoint: str, tickets: list[Admitted]) -> None:
    """The tenant's rate limits over the whole request's tokens (RateLimited raised)."""
    try:
        state.limiter.check(tenant, sum(len(t.prompt_token_ids) + t.params.max_tokens for t in tickets))
    except RateLimited as e:
        state.metrics.throttled.labels(tenant, e.param).inc()
        state.metrics.requests.labels(tenant, endpoint, str(e.status)).inc()
        log.info("%s tenant=%s throttled: %s", rid, tenant, e.param)
        raise


def resolve_model(requested: str | None, tenant: str, base_model_id: str,
                  adapters: AdapterRegistry | None) -> AdapterRef | None:
    """None for the base model (or no `model`); the tenant's adapter's ref; else NotFound."""
    if requested is None or requested == base_model_id:
        return None
    adapter = adapters.resolve(tenant, requested) if adapters is not None else None
    if adapter is None:
        raise NotFound(f"model {requested!r} does not exist; this server serves {base_model_id!r}"
                       + (" and your adapters listed by GET /v1/models" if adapters is not None else ""),
                       param="model", code="model_not_found")
    return AdapterRef(adapter.name, str(adapter.files.path), adapter.files.digest)


def model_list(tenant: str, base_model_id: str, context_length: int, adapters: AdapterRegistry | None) -> dict:
    """GET /v1/models for `tenant`: the base model, then its own adapters (as vLLM lists LoRA modules)."""
    base = {"id": base_model_id, "object": "model", "created": 0, "owned_by": "bulkhead",
            "root": base_model_id, "parent": None, "max_model_len": context_length}
    own = adapters.names(tenant) if adapters is not None else []
    return {"object": "list", "data": [base] + [
        {**base, "id": name, "root": name, "parent": base_model_id} for name in own]}
