"""llama.cpp's `llama-server`: `/props`, `/slots` and `/v1/models`.

Shapes, from llama.cpp tools/server (server.cpp, README):
- /props returns {"default_generation_settings": {..., "n_ctx": N},
  "total_slots": S, "model_path": "...", ...}; n_ctx there is one slot's
  context (the first slot's settings).
- /slots (absent with --no-slots: 501) lists every slot with its own "n_ctx".
- /v1/models lists the GGUF file as the model id.

Each slot holds its own sequence: `-c N --parallel S` gives each slot N/S
tokens of KV (with a unified KV cache each slot may use all N, shared). A
request is refused beyond its slot's n_ctx, so the context a client can use
and the KV it can get are both the smallest slot's n_ctx: that is the
record's context_length and pool_tokens. llama.cpp has no paged pool
(page_size None), does not state its KV dtype over HTTP, and has no
prefill/decode disaggregation (role colocated).
"""

from __future__ import annotations

from bulkhead.audit.dialects.fields import as_int, first_model, smallest
from bulkhead.audit.http_client import EngineClient
from bulkhead.audit.limits import EngineLimits

NAME = "llama.cpp"


def read_limits(client: EngineClient, url: str) -> list[EngineLimits] | None:
    props = client.try_json("/props")
    if not props or not isinstance(props.get("default_generation_settings"), dict):
        return None
    slot_ctx = as_int(props["default_generation_settings"].get("n_ctx"))
    slots = [s for s in client.try_json("/slots", list) or () if isinstance(s, dict)]  # None with --no-slots
    slot_ctx = smallest(s.get("n_ctx") for s in slots) or slot_ctx
    model = first_model(client.try_json("/v1/models")).get("id") or _basename(props.get("model_path"))
    return [EngineLimits(url=url, engine=NAME, role="colocated", model=model, context_length=slot_ctx,
                         max_input_tokens=None, pool_tokens=slot_ctx, page_size=None, kv_dtype=None)]


def _basename(path: object) -> str | None:
    return str(path).replace("\\", "/").rsplit("/", 1)[-1] if path else None
