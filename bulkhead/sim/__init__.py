"""Deterministic simulation of the running disaggregated system (docs/simulation.md)."""
