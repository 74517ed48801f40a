"""The tenants' LoRA adapters for `bulkhead serve`: a registry following keys.toml."""

from __future__ import annotations

import logging
from pathlib import Path

from bulkhead.lora.peft_files import BaseShapes
from bulkhead.lora.registry import AdapterRegistry
from bulkhead.model.config import load_model_config
from bulkhead.server.auth import KeyStore

log = logging.getLogger("bulkhead")


def tenant_adapters(keys: KeyStore | None, model_dir: Path) -> AdapterRegistry | None:
    """None without keys: adapters belong to tenants, and there are none."""
    if keys is None:
        return None
    registry = AdapterRegistry(BaseShapes.of(load_model_config(model_dir))).follow(keys)
    if loaded := registry.loaded():
        log.info("LoRA adapters: %d (%s)", len(loaded), ", ".join(sorted(f"{a.tenant}/{a.name}" for a in loaded)))
    return registry
