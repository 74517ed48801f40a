"""How a worker's C delta multiplies an adapter, chosen once per process,
and so how it holds it (bulkhead.model.lora_layers packs it that way;
bulkhead.lora.peft_files.resident_bytes counts it). No torch: the router
reports the bytes a worker holds without loading a model.

    int8  int8 weights, one scale per rank; x and u in int16 (AVX-512 VNNI):
          half the bytes a step of bf16, the default where the CPU has it
    bf16  bf16 weights; x and u rounded to bf16 (AVX-512 BF16)
    fp32  bf16 weights; fp32 products (any CPU): the nearest to the exact path

BULKHEAD_LORA_PRODUCTS (int8, bf16 or fp32) in the workers' environment
picks one the CPU has; docs/adapters.md gives each one's bounds and cost.
The exact path (`--precision exact`) holds fp32 deltas and none of these.
"""

from __future__ import annotations

import functools
import logging
import os

from bulkhead.cpu import cpu_features

log = logging.getLogger(__name__)

PRODUCTS = ("fp32", "bf16", "int8")  # csrc/lora_delta.c's PRODUCTS_*, in its order
ENV = "BULKHEAD_LORA_PRODUCTS"
# What each needs, as /proc/cpuinfo names it (csrc/lora_delta.c's #if's under -march=native).
NEEDS = {"int8": ("avx512f", "avx512_vnni"), "bf16": ("avx512f", "avx512_bf16"), "fp32": ()}


def preferred(features: frozenset[str] | None = None) -> str:
    """The arithmetic this process's C delta takes: the environment's where
    this CPU has it, else int8, bf16 or fp32, the first it has."""
    features = cpu_features() if features is None else features
    have = [p for p in ("int8", "bf16", "fp32") if set(NEEDS[p]) <= features]
    asked = os.environ.get(ENV)
    if asked in have:
        return asked
    if asked:
        _warn_once(asked, tuple(have))
    return have[0]


@functools.cache
def _warn_once(asked: str, have: tuple[str, ...]) -> None:
    log.warning("%s=%s: not one of %s on this CPU; the delta takes %s", ENV, asked, have, have[0])
