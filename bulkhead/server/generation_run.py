"""One HTTP request's generation: its choices' outputs streamed as server-sent
events or collected into one response, with the metrics and the in-flight
registry kept as they go."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import Response

from bulkhead.errors import BulkheadError
from bulkhead.server.inflight import InFlight, until_cancelled
from bulkhead.server.params import prompt_only
from bulkhead.server.responses import envelope, sse, usage
from bulkhead.server.tools import HeldChoice, ToolPlan

if TYPE_CHECKING:
    from bulkhead.server.app import ServerState

log = logging.getLogger("bulkhead.server.app")  # the request log, as before the split


class GenerationRun:
    """One HTTP request's generation: streams chunks or collects one response."""

    def __init__(self, state: ServerState, rid, tenant, endpoint, tickets, chat, prompt_tokens, body,
                 entry: InFlight, tools: ToolPlan | None = None):
        self.state, self.rid, self.tenant, self.endpoint = state, rid, tenant, endpoint
        self.tickets, self.chat, self.prompt_tokens, self.body, self.entry = tickets, chat, prompt_tokens, body, entry
        self.tools = tools  # an answer may be tool calls: parsed once whole, then sent
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
        outputs = until_cancelled(self.state.backend.generate(self.tickets), self.entry.cancelled)
        return without_completion(outputs) if self.prompt_only else outputs

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
            logprobs = self._echoed_logprobs(i, prompt_lps[i], lps[i]) if self.echo else self._logprobs(lps[i])
            c = {"index": i, "finish_reason": reasons[i], "logprobs": logprobs}
            content, calls = self.tools.parse(texts[i]) if self.tools is not None else (texts[i], [])
            if calls:
                c["message"] = {"role": "assistant", "content": content,
                                "tool_calls": [call.to_dict() for call in calls]}
                c["finish_reason"] = "tool_calls"
            elif self.chat:
                c["message"] = {"role": "assistant", "content": texts[i]}
            else:
                c["text"] = self.echo_texts[i] + texts[i]
            choices.append(c)
        self._done(200, sum(counts))
        return envelope("chat.completion" if self.chat else "text_completion", self.entry.request_id, self.model,
                        choices, usage(self.prompt_tokens, sum(counts)))

    async def stream(self):
        def chunk(choices: list[dict], usage_: dict | None = None) -> str:
            kind = "chat.completion.chunk" if self.chat else "text_completion"
            return sse(envelope(kind, self.entry.request_id, self.model, choices, usage_))

        counts, offsets = [0] * len(self.tickets), [0] * len(self.tickets)
        echoed = [not self.echo] * len(self.tickets)  # the prompt goes out in a choice's first chunk
        held = [HeldChoice() for _ in self.tickets]  # with tools: each answer, until it is whole
        if self.chat:
            for i in range(len(self.tickets)):
                yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}])
        try:
            async for i, out in self._outputs():
                if out.error is not None:
                    self._done(out.error.status, sum(counts))
                    yield sse(out.error.to_dict())
                    return
                self._observe(out)
                counts[i] = out.completion_tokens
                if self.tools is not None:  # chat only, so never with echo (a completions field)
                    for choice in held[i].take(out, i, self.tools, self._logprobs):
                        yield chunk([choice])
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
                yield chunk([choice])
        except asyncio.CancelledError:
            self._done(499, sum(counts))
            raise
        except BulkheadError as e:  # headers are sent: the error goes in the stream
            self._done(e.status, sum(counts))
            yield sse(e.to_dict())
            return
        opts = self.body.stream_options
        if opts is not None and opts.include_usage:
            yield chunk([], usage(self.prompt_tokens, sum(counts)))
        self._done(200, sum(counts))
        yield sse("[DONE]")


async def without_completion(outputs):
    """Echo with max_tokens 0: each output without the token the engine
    sampled (a finished one ends for "length", as max_tokens 0 would).
    Closing this closes `outputs` at once, whose cleanup aborts the engine's requests."""
    try:
        async for i, out in outputs:
            yield i, replace(out, token_ids=(), text="", logprobs=(), completion_tokens=0,
                             finish_reason="length" if out.finished and out.error is None else out.finish_reason)
    finally:
        await outputs.aclose()
