"""The one record every engine dialect is normalised to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROLES = ("colocated", "prefill", "decode", "router", "unknown")

# Spellings of the same KV dtype across engines, mapped to one name so that a
# bf16 prefill and a bfloat16 decode are not reported as a mismatch.
_DTYPE_ALIASES = {
    "bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
    "fp8": "fp8_e4m3",  # vLLM's "fp8" and SGLang's default fp8 are both e4m3
    "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2",
}


def normalise_dtype(name: Any) -> str | None:
    if name is None or name == "":
        return None
    text = str(name).lower()
    return _DTYPE_ALIASES.get(text, text)


@dataclass(frozen=True)
class EngineLimits:
    """Live limits of one worker (or router), as read from the running engine.

    None means the engine did not report the value; checks skip what is unknown
    except the pool, whose absence is itself a finding.
    """

    url: str
    engine: str  # bulkhead | sglang | vllm | llama.cpp
    role: str  # one of ROLES
    model: str | None
    context_length: int | None  # what clients are told they may send (prompt + output)
    max_input_tokens: int | None  # longest prompt the engine itself accepts
    pool_tokens: int | None  # KV tokens the worker's pool holds
    page_size: int | None
    kv_dtype: str | None
    # How far below context_length the engine's own formula puts
    # max_input_tokens when the pool is not the limit (SGLang: 6). None: the
    # engine reports no separate input limit, so there is nothing to compare.
    input_margin: int | None = None
    behind: str | None = None  # the router URL this worker was listed by
