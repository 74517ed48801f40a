"""Lenient readers for the loosely typed values engines report."""

from __future__ import annotations

from typing import Any, Iterable


def as_int(value: Any) -> int | None:
    """An int from 16, "16", 16.0; None for None, "None", "", or anything else."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def smallest(values: Iterable[Any]) -> int | None:
    """The smallest int among `values`: with several ranks, the smallest pool is the limit."""
    ints = [v for v in (as_int(value) for value in values) if v is not None]
    return min(ints) if ints else None


def first_model(models: dict[str, Any] | None) -> dict[str, Any]:
    """The first card of an OpenAI `/v1/models` list, or {}."""
    data = (models or {}).get("data")
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return data[0]
    return {}
