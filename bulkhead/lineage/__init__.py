"""The forensic page-lineage log: what touched tenant KV, hash-chained (docs/architecture.md, "Page lineage")."""
