"""Deterministic simulation of the running disaggregated system (docs/verification.md)."""
