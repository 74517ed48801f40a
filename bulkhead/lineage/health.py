"""How a lineage log's state reads in /health and the metrics. Pure.

A log that cannot be written now (`error`), or that lost records (a gap
record marks where), makes /health answer 503 with the reason: an operator
learns of it from the first probe, never from a hole found after an incident.
"""

from __future__ import annotations


def problem(stats: dict | None) -> str | None:
    """Why this log is not whole, or None (also when there is no log)."""
    if not stats:
        return None
    if stats.get("error"):
        return f"lineage log {stats.get('path')} cannot be written: {stats['error']}"
    if stats.get("records_lost"):
        return f"lineage log {stats.get('path')} lost {stats['records_lost']} records (a gap record marks where)"
    return None


def health(problems: dict[str, str]) -> dict:
    """The /health body: problems by process ("colocated", a worker's name)."""
    if not problems:
        return {"status": "ok"}
    return {"status": "degraded", "lineage": problems}


def metric_samples(stats: dict | None) -> dict[str, tuple[str, float]]:
    """name -> (help, value) for one process's log; empty when there is none."""
    if not stats:
        return {}
    return {
        "bulkhead_lineage_records_written": ("Lineage records on disk", stats["records_written"]),
        "bulkhead_lineage_write_errors": ("Failed attempts to write the lineage log", stats["write_errors"]),
        "bulkhead_lineage_records_lost": ("Lineage records dropped after writes kept failing", stats["records_lost"]),
        "bulkhead_lineage_ok": ("1 while the lineage log is written and whole, else 0", 0 if problem(stats) else 1),
    }
