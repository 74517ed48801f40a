"""One module per engine dialect; each turns its engine's endpoints into EngineLimits.

A dialect's `read_limits(client, url)` returns None when the engine is not of
its kind, so detection is: ask each dialect in DIALECTS order, take the first
answer. bulkhead goes first because its `/server_info` says so explicitly;
SGLang next because it also serves `/server_info`; vLLM is recognised by its
`vllm:cache_config_info` metric; llama.cpp by its `/props`.
"""

from __future__ import annotations

from typing import Callable

from bulkhead.audit.dialects import bulkhead, llamacpp, sglang, vllm
from bulkhead.audit.http_client import EngineClient
from bulkhead.audit.limits import EngineLimits

ReadLimits = Callable[[EngineClient, str], "list[EngineLimits] | None"]

DIALECTS: tuple[tuple[str, ReadLimits], ...] = (
    (bulkhead.NAME, bulkhead.read_limits),
    (sglang.NAME, sglang.read_limits),
    (vllm.NAME, vllm.read_limits),
    (llamacpp.NAME, llamacpp.read_limits),
)

# What detection tried, for the error when nothing matched.
PROBED_PATHS = ("/server_info", "/get_server_info", "/metrics", "/v1/models", "/props", "/slots")
