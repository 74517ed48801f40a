"""How a lineage log's state reads in /ready and the metrics. Pure.

A log that cannot be written now (`error`) makes /ready answer 503 with the
reason: an operator learns of it from the first probe, never from a hole
found after an incident, and a load balancer sends the server nothing
while its records only queue in memory. Records already lost (a gap record
marks where) are history, not a state to wait out: the metrics and
/server_info count them, and `bulkhead lineage verify` exits 4.
"""

from __future__ import annotations


def problem(stats: dict | None) -> str | None:
    """Why this log is not whole, or None (also when there is no log)."""
    if not stats:
        return None
    if (why := unwritable(stats)) is not None:
        return why
    if stats.get("records_lost"):
        return f"lineage log {stats.get('path')} lost {stats['records_lost']} records (a gap record marks where)"
    return None


def unwritable(stats: dict | None) -> str | None:
    """Why this log cannot be written now (/ready's reason), or None."""
    if stats and stats.get("error"):
        return f"lineage log {stats.get('path')} cannot be written: {stats['error']}"
    return None


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
