"""bulkhead's own `/server_info`: every live limit, stated by the engine itself.

Contract (extra keys are ignored):
    {"engine": "bulkhead", "role": "colocated"|"prefill"|"decode"|"router",
     "model": str, "context_length": int, "max_input_tokens": int,
     "pool_tokens": int, "page_size": int, "free_pages": int, "kv_dtype": str,
     "scrub_mode": str, "workers": [<same record per worker, on a router>]}
"""

from __future__ import annotations

from typing import Any

from bulkhead.audit.dialects.fields import as_int
from bulkhead.audit.http_client import EngineClient
from bulkhead.audit.limits import ROLES, EngineLimits, normalise_dtype

NAME = "bulkhead"
# bulkhead reserves at most one position of the context for the first
# generated token, so max_input_tokens is context_length or context_length - 1.
INPUT_MARGIN = 1


def read_limits(client: EngineClient, url: str) -> list[EngineLimits] | None:
    info = client.try_json("/server_info")
    if info is None or info.get("engine") != NAME:
        return None
    records = [_record(info, url, behind=None)]
    for index, worker in enumerate(info.get("workers") or []):
        if isinstance(worker, dict):
            worker_url = str(worker.get("url") or f"{url}#workers[{index}]")
            records.append(_record(worker, worker_url, behind=url))
    return records


def _record(info: dict[str, Any], url: str, behind: str | None) -> EngineLimits:
    role = str(info.get("role") or "unknown")
    ints = {name: as_int(info.get(name)) for name in ("context_length", "max_input_tokens", "pool_tokens", "page_size")}
    return EngineLimits(url=url, engine=NAME, role=role if role in ROLES else "unknown", model=info.get("model"),
                        kv_dtype=normalise_dtype(info.get("kv_dtype")), input_margin=INPUT_MARGIN, behind=behind,
                        **ints)
