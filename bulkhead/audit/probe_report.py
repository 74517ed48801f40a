"""What `bulkhead probe` reports (ProbeReport, a CheckResult per check, the
exit codes) and how: a table for people or JSON for scripts.

Findings name tenants and canaries, never a response's text: the text may be
another customer's data.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from bulkhead.audit.canaries import ProbeFinding

EXIT_CLEAN, EXIT_FINDINGS, EXIT_UNREACHABLE = 0, 1, 2


@dataclass
class CheckResult:
    check: str
    sent: int = 0
    status: str = "ok"  # ok | clamps (over_length: generation cut at the context, safe) | findings | skipped
    detail: str = ""


@dataclass
class ProbeReport:
    url: str
    model: str
    context_length: int | None
    context_source: str
    tenants: tuple[str, ...]
    checks: list[CheckResult] = field(default_factory=list)
    findings: list[ProbeFinding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_FINDINGS if self.findings else EXIT_CLEAN

    def find(self, result: CheckResult, message: str, tenants: tuple[str, ...] = ()) -> None:
        """A finding of result's check, which then reads "findings"."""
        result.status = "findings"
        self.findings.append(ProbeFinding(result.check, message, tenants))

    def skip(self, result: CheckResult, detail: str, warning: str | None = None) -> None:
        result.status, result.detail = "skipped", detail
        if warning is not None:
            self.warnings.append(warning)


def render_table(report: ProbeReport) -> str:
    context = f"{report.context_length:,}" if report.context_length is not None else "-"
    lines = [f"endpoint  {report.url}", f"model     {report.model}  (context {context}, from {report.context_source})",
             f"tenants   {', '.join(report.tenants)}", ""]
    header = ("CHECK", "SENT", "RESULT", "DETAIL")
    rows = [(c.check, str(c.sent), c.status.upper() if c.status != "ok" else "ok", c.detail) for c in report.checks]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]
    for row in [header, *rows]:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths)) + "  " + row[3])
    lines.append("")
    for warning in report.warnings:
        lines.append(f"WARNING  {warning}")
    for finding in report.findings:
        lines.append(f"FINDING  {finding.check}  {finding.message}")
    hits = sum(1 for f in report.findings if f.check == "cross_tenant")
    if report.exit_code == 0:
        lines.append("OK: 0 cross-tenant canary hits, every over-length request refused, no divergence")
    else:
        lines.append(f"{len(report.findings)} finding(s), {hits} cross-tenant canary hit(s)")
    return "\n".join(lines)


def render_json(report: ProbeReport) -> str:
    return json.dumps({
        "url": report.url, "model": report.model, "context_length": report.context_length,
        "context_source": report.context_source, "tenants": list(report.tenants),
        "checks": [asdict(c) for c in report.checks],
        "findings": [asdict(f) for f in report.findings],
        "cross_tenant_hits": sum(1 for f in report.findings if f.check == "cross_tenant"),
        "warnings": report.warnings, "exit_code": report.exit_code,
    }, indent=2)
