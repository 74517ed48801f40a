"""A fake OpenAI-compatible completions server for the probe's tests.

Two behaviours, chosen per app:

- `leaky=True`: remembers every key's recent prompts and, answering another
  key, appends a canary found in them (the incident's symptom: another
  customer's data in a 200). It also answers over-length prompts with 200,
  as the incident's router did.
- `leaky=False`: per-key isolation, a 400 in the OpenAI error shape
  (`context_length_exceeded`) for prompt or prompt + max_tokens over the
  context, deterministic answers, and it answers the coherence question with
  the secret code from the prompt.

Tokens are counted as whitespace-separated words for text and one per id for
token-id prompts, so the probe's usage-based sizing sees exact numbers.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import deque

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

CONTEXT = 512
KEYS = {"sk-probe-alpha": "alpha", "sk-probe-beta": "beta", "sk-probe-gamma": "gamma"}
MODEL = "fake-model"
CANARY = re.compile(r"ZQ-[0-9a-f]{6}")


def keys_toml(keys: dict[str, str] = KEYS) -> str:
    return "[keys]\n" + "".join(f'"{key}" = "{tenant}"\n' for key, tenant in keys.items())


def _count(prompt) -> int:
    if isinstance(prompt, list):
        return len(prompt)
    return len(str(prompt).split())


def make_fake_openai(leaky: bool, recall: bool = True, generation: str = "refuse") -> FastAPI:
    """`recall=False`: a model that cannot find the code in a long prompt (coherence fails).
    `generation`: what a prompt that fits gets when prompt + max_tokens does not:
    "refuse" (a 400), "clamp" (vLLM: 200, finish_reason length, total_tokens = the
    context) or "overrun" (200 with tokens generated past the context)."""
    app = FastAPI()
    recent: deque = deque(maxlen=64)  # (key, prompt), oldest first
    lock = threading.Lock()

    def error(status: int, message: str, code: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                       "code": code}}, status_code=status)

    @app.get("/v1/models")
    def models(request: Request):
        if request.headers.get("authorization", "").removeprefix("Bearer ") not in KEYS:
            return error(401, "bad key", "invalid_api_key")
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": CONTEXT}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        key = request.headers.get("authorization", "").removeprefix("Bearer ")
        if key not in KEYS:
            return error(401, "bad key", "invalid_api_key")
        body = await request.json()
        prompt = body.get("prompt", "")
        max_tokens = int(body.get("max_tokens") or 16)
        n = _count(prompt)
        if not leaky and n + max_tokens > CONTEXT and (n > CONTEXT or generation == "refuse"):
            return error(400, f"{n} + {max_tokens} tokens exceed the context of {CONTEXT}", "context_length_exceeded")
        if not leaky and n + max_tokens > CONTEXT:
            out = CONTEXT - n if generation == "clamp" else max_tokens
            return {"id": "cmpl-fake", "object": "text_completion", "model": MODEL,
                    "choices": [{"index": 0, "text": " word" * out, "finish_reason": "length", "logprobs": None}],
                    "usage": {"prompt_tokens": n, "completion_tokens": out, "total_tokens": n + out}}
        text_prompt = prompt if isinstance(prompt, str) else ""
        asked = re.search(r"The secret code is (ZQ-[0-9a-f]{6})", text_prompt)
        if recall and asked and "What is the secret code?" in text_prompt:
            text = f" {asked.group(1)}."
        else:
            text = " Answer " + hashlib.sha1(repr(prompt).encode()).hexdigest()[:8] + "."
        with lock:
            if leaky:
                # Leak: a fragment (the canary) of another key's most recent prompt.
                for other, seen in reversed(recent):
                    found = CANARY.search(seen)
                    if other != key and found:
                        text += f" Also {found.group(0)}."
                        break
            recent.append((key, text_prompt))
        if body.get("stream"):
            def chunks():
                for word in text.split(" ") + ["more"] * 32:
                    yield "data: " + json.dumps({"choices": [{"index": 0, "text": word + " "}]}) + "\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")
        return {"id": "cmpl-fake", "object": "text_completion", "model": MODEL,
                "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
                "usage": {"prompt_tokens": n, "completion_tokens": len(text.split()), "total_tokens": n}}

    return app
