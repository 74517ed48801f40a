"""The checks preflight runs over live limits, each producing typed
findings (docs/audit.md lists them: pool_below_context is the incident)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Iterable

from bulkhead.audit.limits import EngineLimits

PAIR_FIELDS = ("model", "context_length", "max_input_tokens", "page_size", "kv_dtype")


@dataclass(frozen=True)
class Finding:
    check: str
    urls: tuple[str, ...]
    message: str


def check_worker(worker: EngineLimits) -> list[Finding]:
    if worker.role == "router":
        return []
    found = []
    here = (worker.url,)
    if worker.pool_tokens is None:
        found.append(Finding("pool_unreported", here, "the engine does not report its KV pool size, so it cannot be checked"))
    if worker.context_length is None:
        found.append(Finding("context_unreported", here, "the engine does not report the context length it advertises"))
    if None not in (worker.pool_tokens, worker.context_length) and worker.pool_tokens < worker.context_length:
        found.append(Finding("pool_below_context", here,
                             f"KV pool holds {worker.pool_tokens:,} tokens but the advertised context is "
                             f"{worker.context_length:,}: {worker.context_length - worker.pool_tokens:,} tokens short"))
    found.extend(_check_input_limit(worker))
    return found


def _check_input_limit(worker: EngineLimits) -> list[Finding]:
    if None in (worker.max_input_tokens, worker.context_length, worker.input_margin):
        return []
    gap = worker.context_length - worker.max_input_tokens
    if 0 <= gap <= worker.input_margin:
        return []
    return [Finding("input_limit_off_context", (worker.url,),
                    f"max input tokens {worker.max_input_tokens:,} vs context length {worker.context_length:,}: "
                    f"gap {gap:,}, {worker.engine} documents 0..{worker.input_margin}")]


def check_router(router: EngineLimits, workers: Iterable[EngineLimits]) -> list[Finding]:
    return [Finding("router_context_above_worker", (router.url, worker.url),
                    f"router advertises {router.context_length:,} tokens; "
                    f"this {worker.role} worker accepts {worker.context_length:,}")
            for worker in workers
            if None not in (router.context_length, worker.context_length)
            and router.context_length > worker.context_length]


def check_pairs(records: Iterable[EngineLimits]) -> list[Finding]:
    records = list(records)
    prefills = [r for r in records if r.role == "prefill"]
    decodes = [r for r in records if r.role == "decode"]
    found = []
    for prefill, decode in product(prefills, decodes):
        for field in PAIR_FIELDS:
            left, right = getattr(prefill, field), getattr(decode, field)
            if None not in (left, right) and left != right:
                found.append(Finding("pair_mismatch", (prefill.url, decode.url),
                                     f"{field}: prefill {_show(left)} vs decode {_show(right)}"))
    return found


def _show(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else repr(value)
