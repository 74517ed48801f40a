"""SGLang: `/server_info` (or the older `/get_server_info`) plus `/v1/models`.

Shapes, from sglang/python/sglang/srt/entrypoints/http_server.py:
- get_server_info returns {**asdict(server_args), **scheduler_info,
  "internal_states": [...one dict per DP rank...], "version": ...}.
  scheduler_info carries max_total_num_tokens (the KV pool, in tokens) and
  max_req_input_len; server_args carries context_length (null unless set on
  the command line), page_size, kv_cache_dtype, dtype, disaggregation_mode
  ("null" | "prefill" | "decode"), served_model_name.
- /v1/models returns ModelCards whose max_model_len is
  model_config.context_len: the context the engine actually enforces.

The scheduler derives max_req_input_len = min(context_len - 1, pool - 1) - 5,
so each side of a disaggregated pair computes its own input limit from its
own pool: the disagreement behind the incident.
"""

from __future__ import annotations

from typing import Any

from bulkhead.audit.dialects.fields import as_int, first_model, smallest
from bulkhead.audit.http_client import EngineClient
from bulkhead.audit.limits import EngineLimits, normalise_dtype

NAME = "sglang"
INPUT_MARGIN = 6  # context_len - 1, then 5 more, when the pool is not the limit

_ROLE_BY_MODE = {"null": "colocated", "": "colocated", "prefill": "prefill", "decode": "decode"}


def read_limits(client: EngineClient, url: str) -> list[EngineLimits] | None:
    info = client.try_json("/server_info")
    if not _is_sglang(info):
        info = client.try_json("/get_server_info")
    if info is None or not _is_sglang(info):
        return None
    card = first_model(client.try_json("/v1/models"))
    states = [s for s in info.get("internal_states") or [] if isinstance(s, dict)]
    usages = [s["memory_usage"] for s in states if isinstance(s.get("memory_usage"), dict)]
    pool = smallest([info.get("max_total_num_tokens")] + [s.get("max_total_num_tokens") for s in states]
                    + [u.get("token_capacity") for u in usages])
    max_input = smallest([info.get("max_req_input_len")] + [s.get("max_req_input_len") for s in states])
    mode = str(info.get("disaggregation_mode") or "null").lower()
    model = card.get("id") or info.get("served_model_name") or info.get("model_path")
    return [EngineLimits(url=url, engine=NAME, role=_ROLE_BY_MODE.get(mode, "unknown"), model=model,
                         context_length=as_int(card.get("max_model_len")) or as_int(info.get("context_length")),
                         max_input_tokens=max_input, pool_tokens=pool, page_size=as_int(info.get("page_size")),
                         kv_dtype=_kv_dtype(info), input_margin=INPUT_MARGIN)]


def _is_sglang(info: dict[str, Any] | None) -> bool:
    return info is not None and ("max_total_num_tokens" in info or "disaggregation_mode" in info)


def _kv_dtype(info: dict[str, Any]) -> str | None:
    # "auto" means "the model dtype"; report that when the server states it.
    kv = str(info.get("kv_cache_dtype") or "auto")
    if kv == "auto" and info.get("dtype") not in (None, "auto"):
        kv = str(info["dtype"])
    return normalise_dtype(kv)
