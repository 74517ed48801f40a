"""vLLM: `/v1/models` for the context, `/metrics` for the KV pool.

Shapes:
- /v1/models (vllm/entrypoints/openai/protocol.py ModelCard) carries
  max_model_len, the context vLLM enforces; vLLM has no separate input limit.
- /metrics carries `vllm:cache_config_info`, an info gauge whose labels are
  CacheConfig's fields (vllm/v1/metrics/loggers.py, log_metrics_info
  ("cache_config", ...)): block_size, num_gpu_blocks, cache_dtype, ... with
  one sample per engine under data parallelism.
  pool tokens = num_gpu_blocks x block_size.

vLLM does not publish its KV-transfer role (kv_producer/kv_consumer) in
either endpoint; give it on the command line as prefill=URL or decode=URL.
"""

from __future__ import annotations

from bulkhead.audit.dialects.fields import as_int, first_model
from bulkhead.audit.http_client import EngineClient
from bulkhead.audit.limits import EngineLimits, normalise_dtype
from bulkhead.audit.prometheus_text import label_sets

NAME = "vllm"
CACHE_INFO_METRIC = "vllm:cache_config_info"


def read_limits(client: EngineClient, url: str) -> list[EngineLimits] | None:
    metrics = client.try_text("/metrics")
    if metrics is None:
        return None
    caches = label_sets(metrics, CACHE_INFO_METRIC)
    if not caches:
        return None
    pools = []
    for labels in caches:
        blocks, block_size = as_int(labels.get("num_gpu_blocks")), as_int(labels.get("block_size"))
        if blocks is not None and block_size is not None:
            pools.append(blocks * block_size)
    card = first_model(client.try_json("/v1/models"))
    return [EngineLimits(url=url, engine=NAME, role="unknown", model=card.get("id"),
                         context_length=as_int(card.get("max_model_len")), max_input_tokens=None,
                         pool_tokens=min(pools) if pools else None, page_size=as_int(caches[0].get("block_size")),
                         kv_dtype=normalise_dtype(caches[0].get("cache_dtype")))]
