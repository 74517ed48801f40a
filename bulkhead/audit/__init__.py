"""Audit tools that check a deployment's KV capacity before and while it serves.

- `plan`: KV bytes per token and pool tokens from a model config and a memory
  budget, for deployments bigger than the machine running the check.
- `preflight`: read the live limits of running engines (bulkhead, SGLang,
  vLLM) and flag pools that cannot hold the advertised context and
  prefill/decode pairs that disagree.
- `probe`: send canary-carrying completions as several tenants to any
  OpenAI-compatible endpoint and report cross-tenant canary hits, over-length
  requests answered 2xx, solo vs concurrent divergence, long-context recall
  and abort safety.

None imports torch: they are arithmetic over ints and HTTP calls.
"""
