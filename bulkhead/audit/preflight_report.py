"""Render a PreflightReport as a table for people or JSON for scripts."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bulkhead.audit.preflight import PreflightReport

_COLUMNS = (("URL", "url"), ("ENGINE", "engine"), ("ROLE", "role"), ("MODEL", "model"),
            ("CONTEXT", "context_length"), ("MAX INPUT", "max_input_tokens"), ("POOL", "pool_tokens"),
            ("PAGE", "page_size"), ("KV DTYPE", "kv_dtype"))


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else str(value)


def render_table(report: PreflightReport) -> str:
    rows = [[_cell(getattr(r, field)) for _, field in _COLUMNS] for r in report.records]
    rows += [[u.url, "?", "?", "-", "-", "-", "-", "-", "-"] for u in report.unreadable]
    header = [title for title, _ in _COLUMNS]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.append("")
    for unread in report.unreadable:
        lines.append(f"UNREADABLE  {unread.url}: {unread.reason}")
    for finding in report.findings:
        lines.append(f"FINDING  {finding.check}  {' <-> '.join(finding.urls)}: {finding.message}")
    if report.exit_code == 0:
        lines.append(f"OK: {len(report.records)} engine record(s), every pool holds its advertised context, pairs agree")
    else:
        lines.append(f"{len(report.findings)} finding(s), {len(report.unreadable)} unreadable engine(s)")
    return "\n".join(lines)


def render_json(report: PreflightReport) -> str:
    return json.dumps({
        "records": [asdict(r) for r in report.records],
        "findings": [{"check": f.check, "urls": list(f.urls), "message": f.message} for f in report.findings],
        "unreadable": [{"url": u.url, "reason": u.reason} for u in report.unreadable],
        "exit_code": report.exit_code,
    }, indent=2)
