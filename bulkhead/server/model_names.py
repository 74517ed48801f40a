"""What a request's `model` names, for the tenant asking: the base model, one
of the tenant's own LoRA adapters, or nothing.

A name that is another tenant's adapter gets exactly the 404 of a name that
exists nowhere (the same message, code and parameter), so no answer tells a
tenant what another tenant has loaded. /v1/models lists the base model and
the caller's own adapters only.
"""

from __future__ import annotations

from bulkhead.engine.admission import AdapterRef
from bulkhead.errors import NotFound
from bulkhead.lora.registry import AdapterRegistry


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


def model_list(tenant: str, base_model_id: str, context_length: int,
               adapters: AdapterRegistry | None) -> dict:
    """GET /v1/models for `tenant`: the base model, then its own adapters (as vLLM lists LoRA modules)."""
    base = {"id": base_model_id, "object": "model", "created": 0, "owned_by": "bulkhead",
            "root": base_model_id, "parent": None, "max_model_len": context_length}
    own = adapters.names(tenant) if adapters is not None else []
    return {"object": "list", "data": [base] + [
        {**base, "id": name, "root": name, "parent": base_model_id} for name in own]}
