"""The soak's mixed load: many tenants, every prompt with its own canary.

Each request is one of these kinds (the first `len(KINDS)` requests go
through every kind once, so even a short run injects each of them):

  stream, plain            completions, streamed or not; prompt = "Code <canary>." + filler
                           of a random length up to the limit + "Repeat this code exactly: <canary>"
  chat_stream, chat_plain  the same through the chat template
  over_length              prompt + max_tokens one past the context (or the prompt
                           alone past it): must be a typed 400 context_length_exceeded
                           that names the limit and the value; a 200 is the incident
  disconnect               a stream the client closes after its first token
  cancel                   a non-streamed request the client gives up on mid-generation
  json_schema              chat with response_format json_schema: the answer must parse
                           and match (unless cut by max_tokens), grammar mask and all
  tool_call                chat with tools and tool_choice "required": the answer must be
                           a tool call whose arguments parse

Every response text, whole or partial, goes through the canary check.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from bench.canaries import CanaryLedger

KINDS = ("stream", "plain", "chat_stream", "chat_plain", "over_length", "disconnect", "cancel", "json_schema",
         "tool_call")
WEIGHTS = (3, 2, 1, 1, 1, 1, 1, 1, 1)
CODE_SCHEMA = {"type": "object", "properties": {"code": {"type": "string", "maxLength": 24}}, "required": ["code"],
               "additionalProperties": False}
RECORD_TOOL = {"type": "function", "function": {"name": "record_code", "parameters": CODE_SCHEMA}}
STRUCTURED_TOKENS = 64  # a call or an object around a code of at most 24 characters
FILLER = "The quiet river runs past the old mill and the green hills. "
ANSWER_TOKENS = 16  # enough for the model to repeat a canary (about 8 tokens)
LONG_TOKENS = 48  # disconnect/cancel targets: generation must still be running when the client leaves
CHAT_OVERHEAD = 64  # chat template tokens around the user message, generously


@dataclass(frozen=True)
class Limits:
    context_length: int  # prompt + max_tokens, as the server advertises it
    max_input_tokens: int


@dataclass
class Tally:
    started: Counter = field(default_factory=Counter)  # by kind
    served: Counter = field(default_factory=Counter)  # by kind: a complete 200
    rejections: Counter = field(default_factory=Counter)  # typed 4xx/503 by error code
    errors: Counter = field(default_factory=Counter)  # anything else, by kind
    disconnects: int = 0  # streams closed by the client mid-generation
    cancels: int = 0  # non-streamed requests abandoned mid-generation
    prompt_tokens_max: int = 0  # longest admitted prompt sent

    @property
    def requests_served(self) -> int:
        return sum(self.served.values())


class SoakLoad:
    def __init__(self, url: str, keys: dict[str, str], limits: Limits, tokenizer, seed: int = 0):
        self.url, self.keys, self.limits = url, keys, limits
        self.rng = random.Random(seed)
        self.ledger = CanaryLedger()
        self.tally = Tally()
        self.encode = tokenizer.encode
        self.filler_ids = self.encode(FILLER * (limits.context_length // 8 + 1))
        self._issued = 0

    # -- the schedule ------------------------------------------------------

    def next_kind(self) -> str:
        i, self._issued = self._issued, self._issued + 1
        return KINDS[i] if i < len(KINDS) else self.rng.choices(KINDS, WEIGHTS)[0]

    def prompt_length(self, room: int) -> int:
        """Mostly short prompts, some long, some exactly at the limit."""
        r = self.rng.random()
        if r < 0.6:
            return self.rng.randint(0, min(64, room))
        if r < 0.9:
            return self.rng.randint(0, room)
        return room

    def completion_prompt(self, canary: str, max_tokens: int) -> list[int]:
        # The canary opens the prompt (where a stale page would carry it) and
        # closes it as a pattern the small model reliably continues.
        head = self.encode(f"Code {canary}.\n")
        tail = self.encode(f"\nRepeat this code exactly: {canary}\n{canary}\n{canary}\n")
        room = self.limits.context_length - max_tokens - len(head) - len(tail)
        ids = head + self.filler_ids[: self.prompt_length(room)] + tail
        self.tally.prompt_tokens_max = max(self.tally.prompt_tokens_max, len(ids))
        return ids

    def chat_messages(self, canary: str, max_tokens: int) -> list[dict]:
        room = (self.limits.context_length - max_tokens - CHAT_OVERHEAD) // 2  # filler is ~2 tokens a word
        words = FILLER.split() * (room // 12 + 1)
        filler = " ".join(words[: self.prompt_length(room)])
        return [{"role": "user", "content": f"Code {canary}.\n{filler}\nRepeat this code exactly: {canary}"}]

    # -- one request -------------------------------------------------------

    async def one(self, http: httpx.AsyncClient, kind: str) -> None:
        key = self.rng.choice(list(self.keys))
        tenant = self.keys[key]
        canary = self.ledger.mint(tenant)
        headers = {"Authorization": f"Bearer {key}"}
        sampling = {"temperature": 0} if self.rng.random() < 0.5 else {"temperature": 0.8,
                                                                       "seed": self.rng.randrange(2**31)}
        self.tally.started[kind] += 1
        if kind == "over_length":
            await self.over_length(http, headers)
        elif kind in ("stream", "plain", "disconnect", "cancel"):
            max_tokens = LONG_TOKENS if kind in ("disconnect", "cancel") else ANSWER_TOKENS
            body = {"prompt": self.completion_prompt(canary, max_tokens), "max_tokens": max_tokens, **sampling}
            if kind in ("disconnect", "cancel"):
                body["ignore_eos"] = True
            await self.send(http, "/v1/completions", headers, body, kind, tenant, canary)
        elif kind in ("json_schema", "tool_call"):
            body = {"messages": self.chat_messages(canary, STRUCTURED_TOKENS), "max_tokens": STRUCTURED_TOKENS,
                    **sampling}
            if kind == "json_schema":
                body["response_format"] = {"type": "json_schema", "json_schema": {"name": "code",
                                                                                  "schema": CODE_SCHEMA}}
            else:
                body |= {"tools": [RECORD_TOOL], "tool_choice": "required"}
            await self.structured(http, body, kind, headers, tenant, canary)
        else:
            body = {"messages": self.chat_messages(canary, ANSWER_TOKENS), "max_tokens": ANSWER_TOKENS, **sampling}
            await self.send(http, "/v1/chat/completions", headers, body, kind, tenant, canary)

    async def send(self, http, path, headers, body, kind, tenant, canary) -> None:
        if kind == "cancel":
            try:
                await asyncio.wait_for(self.plain(http, path, headers, body, kind, tenant, canary),
                                       timeout=self.rng.uniform(0.2, 1.0))  # after the server has the request
            except TimeoutError:
                self.tally.cancels += 1
        elif kind in ("stream", "chat_stream", "disconnect"):
            await self.stream(http, path, headers, body | {"stream": True}, kind, tenant, canary)
        else:
            await self.plain(http, path, headers, body, kind, tenant, canary)

    async def plain(self, http, path, headers, body, kind, tenant, canary) -> None:
        r = await http.post(self.url + path, json=body, headers=headers)
        if r.status_code != 200:
            self.count_failure(r.status_code, r.content)
            return
        choice = r.json()["choices"][0]
        text = choice.get("text") or (choice.get("message") or {}).get("content") or ""
        self.ledger.check(tenant, canary, text)
        self.tally.served[kind] += 1

    async def stream(self, http, path, headers, body, kind, tenant, canary) -> None:
        text = ""
        async with http.stream("POST", self.url + path, json=body, headers=headers) as r:
            if r.status_code != 200:
                self.count_failure(r.status_code, await r.aread())
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    self.ledger.check(tenant, canary, text)
                    self.count_failure(500, line[6:].encode())
                    return
                for c in chunk.get("choices", ()):
                    text += c.get("text") or (c.get("delta") or {}).get("content") or ""
                if kind == "disconnect" and text:
                    self.ledger.check(tenant, canary, text)
                    self.tally.disconnects += 1
                    return  # leaving the block closes the connection mid-generation
        self.ledger.check(tenant, canary, text)
        self.tally.served[kind] += 1

    async def structured(self, http, body, kind, headers, tenant, canary) -> None:
        """The answer is checked for canaries and for its shape: an object
        that matches, or a call whose arguments parse (a grammar bug is an error)."""
        r = await http.post(self.url + "/v1/chat/completions", json=body, headers=headers)
        if r.status_code != 200:
            self.count_failure(r.status_code, r.content)
            return
        choice = r.json()["choices"][0]
        message = choice["message"]
        calls = message.get("tool_calls") or []
        text = (message.get("content") or "") + "".join(c["function"]["arguments"] for c in calls)
        self.ledger.check(tenant, canary, text)
        if choice["finish_reason"] != "length":
            try:
                value = json.loads(calls[0]["function"]["arguments"] if kind == "tool_call" else message["content"])
                shaped = isinstance(value, dict) and isinstance(value.get("code"), str)
            except (IndexError, TypeError, ValueError):
                shaped = False
            if not shaped or (kind == "tool_call" and choice["finish_reason"] != "tool_calls"):
                self.tally.errors[f"{kind}_malformed"] += 1
                return
        self.tally.served[kind] += 1

    async def over_length(self, http, headers) -> None:
        max_input, context = self.limits.max_input_tokens, self.limits.context_length
        if self.rng.random() < 0.5:  # the prompt alone is too long
            prompt, max_tokens = self.filler_ids[: max_input + 1], 1
        else:  # the prompt fits; prompt + max_tokens is one past the context
            n = self.rng.randint(1, max_input)
            prompt, max_tokens = self.filler_ids[:n], context - n + 1
        r = await http.post(self.url + "/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens},
                            headers=headers)
        if r.status_code == 200:
            self.tally.errors["over_length_served"] += 1  # the incident: never
            return
        err = _error_body(r.content)
        typed = (r.status_code == 400 and err.get("code") == "context_length_exceeded"
                 and "limit" in err and "value" in err)
        if typed:
            self.tally.rejections["context_length_exceeded"] += 1
        else:
            self.tally.errors[f"over_length_untyped_{r.status_code}_{err.get('code')}"] += 1

    def count_failure(self, status: int, content: bytes) -> None:
        code = _error_body(content).get("code")
        if status == 503 and code == "server_overloaded" or 400 <= status < 500 and code:
            self.tally.rejections[code] += 1
        else:
            self.tally.errors[f"{status}_{code}"] += 1

    # -- the run -----------------------------------------------------------

    async def run(self, duration_s: float, concurrency: int, timeout_s: float = 300.0) -> Tally:
        deadline = time.monotonic() + duration_s

        async def client(http):
            while time.monotonic() < deadline:
                kind = self.next_kind()
                try:
                    await self.one(http, kind)
                except httpx.HTTPError as e:
                    self.tally.errors[f"transport_{type(e).__name__}"] += 1

        limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as http:
            await asyncio.gather(*(client(http) for _ in range(concurrency)))
        return self.tally


def _error_body(content: bytes) -> dict:
    try:
        body = json.loads(content)
    except ValueError:
        return {}
    return body.get("error") or {} if isinstance(body, dict) else {}
