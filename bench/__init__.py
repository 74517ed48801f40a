"""Benchmarks and reliability runs (run as scripts: `python bench/soak.py`; tests import them)."""
