"""The peers benchmark's workload: the prompts, and a closed-loop streaming
client that measures each request's time to first token and per-token time.

Every system gets the same prompts. They are random token ids passed once
through the model's tokenizer (decode, encode, cut to length), so that the
text form, for servers that only take text, tokenizes back to about the same
ids.
"""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from dataclasses import dataclass

import httpx


# Random prompt ids are drawn from [ID_LOW, ID_HIGH): clear of the special
# tokens at the start of the vocabulary, inside every vocabulary measured.
ID_LOW, ID_HIGH = 1000, 40000


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    text: str


def make_prompts(tokenizer, n: int, length: int, seed: int) -> list[Prompt]:
    """tokenizer: a `tokenizers.Tokenizer`. Ids stay clear of special tokens."""
    import torch

    g = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(n):
        raw = torch.randint(ID_LOW, ID_HIGH, (2 * length,), generator=g).tolist()
        ids = tokenizer.encode(tokenizer.decode(raw), add_special_tokens=False).ids[:length]
        assert len(ids) == length  # static batches (transformers) need equal lengths
        prompts.append(Prompt(ids, tokenizer.decode(ids)))
    return prompts


@dataclass(frozen=True)
class Endpoint:
    """How to ask one OpenAI-compatible server for a benchmark completion."""

    url: str
    model: str
    text_prompts: bool = False  # the server takes only text
    # How the server is made to produce exactly max_tokens tokens: the
    # `ignore_eos` extension (bulkhead, vLLM, llama-server) or `min_tokens`.
    exact_length: str = "ignore_eos"
    extra: tuple[tuple[str, object], ...] = ()  # other server-specific body fields

    def body(self, prompt: Prompt, output_tokens: int) -> dict:
        body = {"model": self.model, "prompt": prompt.text if self.text_prompts else prompt.ids,
                "max_tokens": output_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, **dict(self.extra)}
        body[self.exact_length] = True if self.exact_length == "ignore_eos" else output_tokens
        return body


async def one_request(http: httpx.AsyncClient, ep: Endpoint, prompt: Prompt, output_tokens: int) -> dict:
    start = time.perf_counter()
    first = None
    chunks = 0
    usage = None
    async with http.stream("POST", ep.url + "/v1/completions", json=ep.body(prompt, output_tokens)) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:500]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if chunk.get("choices"):
                first = first or time.perf_counter()
                chunks += 1
            usage = chunk.get("usage") or usage
    end = time.perf_counter()
    # One chunk per token where the server sends no usage.
    tokens = usage["completion_tokens"] if usage else chunks
    return {"ttft": first - start, "tpot": (end - first) / max(1, tokens - 1), "tokens": tokens}


async def closed_loop(ep: Endpoint, prompts: list[Prompt], concurrency: int, output_tokens: int,
                      client_endpoints: list[Endpoint] | None = None, headers: dict | None = None) -> dict:
    """`concurrency` clients, each sending its next request as soon as the
    last one ends; client i asks client_endpoints[i] where given (another
    `model` per client: bench/lora.py), else `ep`."""
    queue = list(reversed(prompts))
    records: list[dict] = []

    async def client(http, own: Endpoint):
        while queue:
            records.append(await one_request(http, own, queue.pop(), output_tokens))

    # A new connection per request, for every system alike: llama-server
    # closes a streamed response's connection without saying so, and a
    # client that reused it failed with "Server disconnected without sending
    # a response" at 16 clients. On loopback a connection costs ~0.1 ms.
    own = client_endpoints or [ep] * concurrency
    async with httpx.AsyncClient(timeout=1800, limits=httpx.Limits(max_keepalive_connections=0),
                                 headers=headers) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http, own[i]) for i in range(concurrency)))
        wall = time.perf_counter() - start
    return {"wall_s": wall, "records": records}


def unseen(prompt: Prompt) -> Prompt:
    """A prompt of the same length whose first id differs from `prompt`'s
    (its ids reversed, the first moved by one where that is the same id): a
    server's prefix cache cannot answer one from the other."""
    ids = prompt.ids[::-1]
    if ids[0] == prompt.ids[0]:
        ids[0] += 1 if ids[0] < ID_HIGH else -1  # stays a plain token: inside the vocabulary, off id 0
    return Prompt(ids, "")


def run_level(ep: Endpoint, prompts: list[Prompt], concurrency: int, output_tokens: int) -> dict:
    # Warm-up: first-request costs are not the level's. Not one of the
    # level's prompts: a server with a prefix cache (vLLM, llama-server, a
    # bulkhead prefill worker) would then answer that one from its cache.
    warm = unseen(prompts[0])
    asyncio.run(closed_loop(ep, [warm if not ep.text_prompts else prompts[0]], 1, 4))
    return asyncio.run(closed_loop(ep, prompts, concurrency, output_tokens))


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: a value that was measured, never interpolated."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def short_requests(records: list[dict], expected_tokens: int) -> str | None:
    """Why a level's figures do not count, or None when they do: every
    request must have produced exactly the tokens asked for. A server that
    cuts streams short (llama-cpp-python's, when another request arrives)
    would otherwise report a tiny TPOT and a throughput it never served."""
    wrong = [r["tokens"] for r in records if r["tokens"] != expected_tokens]
    if not records:
        return "no requests completed"
    if not wrong:
        return None
    return (f"{len(wrong)} of {len(records)} requests produced other than {expected_tokens} tokens "
            f"({min(wrong)}..{max(wrong)})")


def summarise(wall_s: float, records: list[dict], expected_tokens: int | None = None) -> dict:
    """The level's figures; with expected_tokens, a level in which any request
    produced another count carries `invalid` (why) and its figures must not be
    quoted or compared (bench.report shows the reason instead)."""
    ttfts = [r["ttft"] for r in records]
    summary = {
        "requests": len(records),
        "output_tokens": sum(r["tokens"] for r in records),
        "tok_s": sum(r["tokens"] for r in records) / wall_s,
        "ttft_median_s": statistics.median(ttfts),
        "ttft_p99_s": percentile(ttfts, 99),
        "tpot_median_s": statistics.median(r["tpot"] for r in records),
        "wall_s": wall_s,
    }
    if expected_tokens is not None and (why := short_requests(records, expected_tokens)):
        summary["invalid"] = why
    return summary
