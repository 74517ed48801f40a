"""OpenAI response and stream-chunk shapes."""

from __future__ import annotations

import json
import time

from bulkhead.engine.outputs import TokenLogprobs
from bulkhead.model.tokenizer import Tokenizer


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def envelope(kind: str, response_id: str, model: str, choices: list[dict], usage_: dict | None = None) -> dict:
    body = {"id": response_id, "object": kind, "created": int(time.time()), "model": model, "choices": choices}
    if usage_ is not None:
        body["usage"] = usage_
    return body


class LogprobFormatter:
    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer

    def completion(self, items: list[TokenLogprobs], text_offset: int = 0) -> dict:
        tokens, lps, tops, offsets = [], [], [], []
        for it in items:
            s = self.tok.token_text(it.token_id)
            tokens.append(s)
            lps.append(it.logprob)
            tops.append({self.tok.token_text(t): lp for t, lp in it.top})
            offsets.append(text_offset)
            text_offset += len(s)
        return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}

    def echoed(self, prompt_ids: list[int], items: tuple[TokenLogprobs, ...], completion: dict | None) -> dict:
        """Echo with logprobs: the prompt's tokens, then the completion's
        (offsets already past the prompt). The first prompt token has no
        logprob and no top (null, as OpenAI and vLLM answer)."""
        body = self.completion([TokenLogprobs(prompt_ids[0], 0.0, ())] + list(items)) if prompt_ids else \
            {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        if body["tokens"]:
            body["token_logprobs"][0] = body["top_logprobs"][0] = None
        for key in body:
            body[key] += (completion or {}).get(key, [])
        return body

    def chat(self, items: list[TokenLogprobs]) -> dict:
        def entry(token_id: int, lp: float) -> dict:
            s = self.tok.token_text(token_id)
            return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

        return {"content": [{**entry(it.token_id, it.logprob), "top_logprobs": [entry(t, lp) for t, lp in it.top]}
                            for it in items]}
