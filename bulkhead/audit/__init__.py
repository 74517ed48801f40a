"""Audit tools that check a deployment's KV capacity before and while it serves.

- `plan`: KV bytes per token and pool tokens from a model config and a memory
  budget, for deployments bigger than the machine running the check.
- `preflight`: read the live limits of running engines (bulkhead, SGLang,
  vLLM) and flag pools that cannot hold the advertised context and
  prefill/decode pairs that disagree.

Neither imports torch: both are arithmetic over ints and HTTP reads.
"""
