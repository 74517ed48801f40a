"""Audit tools that check a deployment's KV capacity before and while it
serves: `plan` (arithmetic from a model config), `preflight` (live limits of
running engines) and `probe` (canary traffic against any OpenAI-compatible
endpoint); docs/audit.md describes each. None imports torch."""
