"""`bulkhead preflight`: read every engine's live limits and flag what cannot hold.

The check Cloudflare now runs before a disaggregated deployment ships: KV
pool size against context length, read from the running engine, on every
prefill and decode worker, and the two sides against each other.

Exit 0: every limit read and clean. 1: findings. 2: an engine could not be
read (no connection, refused auth, or a shape no dialect knows) — a
deployment that cannot be seen is not vouched for, whatever else was found.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace

import httpx

from bulkhead.audit.dialects import DIALECTS, PROBED_PATHS
from bulkhead.audit.errors import AuditError, EngineResponseError
from bulkhead.audit.findings import Finding, check_pairs, check_router, check_worker
from bulkhead.audit.http_client import EngineClient
from bulkhead.audit.limits import EngineLimits
from bulkhead.audit.preflight_report import render_json, render_table

EXIT_CLEAN, EXIT_FINDINGS, EXIT_UNREACHABLE = 0, 1, 2
DEFAULT_TIMEOUT_S = 10.0
# Roles an operator may name on the command line; a router states its own.
HINTABLE_ROLES = ("prefill", "decode", "colocated")


@dataclass(frozen=True)
class EngineTarget:
    """One command-line URL, optionally tagged with the role the operator expects."""

    url: str
    role_hint: str | None = None

    @classmethod
    def parse(cls, spec: str) -> EngineTarget:
        """`URL` or `ROLE=URL` (ROLE: prefill, decode, colocated). A URL that
        ends in /v1 (the base URL an OpenAI client is given) names the engine
        above it, whose operator endpoints (/server_info, /metrics, /props) are there."""
        role, sep, rest = spec.partition("=")
        if sep and role in HINTABLE_ROLES and "://" in rest:
            return cls(url=_engine_root(rest), role_hint=role)
        return cls(url=_engine_root(spec))


def _engine_root(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")


@dataclass(frozen=True)
class Unreadable:
    url: str
    reason: str


@dataclass(frozen=True)
class PreflightReport:
    records: tuple[EngineLimits, ...]
    findings: tuple[Finding, ...]
    unreadable: tuple[Unreadable, ...]

    @property
    def exit_code(self) -> int:
        if self.unreadable:
            return EXIT_UNREACHABLE
        return EXIT_FINDINGS if self.findings else EXIT_CLEAN


def read_engine(target: EngineTarget, client: httpx.Client) -> list[EngineLimits]:
    """Every record one URL yields (a router yields itself and its workers)."""
    engine = EngineClient(target.url, client)
    for name, read_limits in DIALECTS:
        try:
            records = read_limits(engine, engine.base_url)
        except (TypeError, ValueError, AttributeError) as error:
            # A value of the wrong JSON type deep in a response: unreadable, not a crash.
            raise EngineResponseError(target.url, f"malformed {name} response ({error})") from error
        if records is not None:
            return records
    raise EngineResponseError(target.url, f"no known engine dialect answered (tried {', '.join(PROBED_PATHS)})")


def _apply_role_hint(records: list[EngineLimits], target: EngineTarget) -> tuple[list[EngineLimits], list[Finding]]:
    # The hint fills a role the engine cannot state (vLLM); it never overrides
    # one the engine states, and a disagreement is a finding of its own.
    if target.role_hint is None:
        return records, []
    head, rest = records[0], records[1:]
    if head.role == "unknown":
        return [replace(head, role=target.role_hint), *rest], []
    if head.role != target.role_hint:
        message = f"given as {target.role_hint} but the engine reports {head.role}"
        return records, [Finding("role_conflict", (head.url,), message)]
    return records, []


def audit(targets: list[EngineTarget], client: httpx.Client) -> PreflightReport:
    records: list[EngineLimits] = []
    findings: list[Finding] = []
    unreadable: list[Unreadable] = []
    for target in targets:
        try:
            read = read_engine(target, client)
        except AuditError as error:
            unreadable.append(Unreadable(target.url, getattr(error, "reason", str(error))))
            continue
        read, role_findings = _apply_role_hint(read, target)
        findings.extend(role_findings)
        records.extend(read)
    for record in records:
        findings.extend(check_worker(record))
        if record.role == "router":
            findings.extend(check_router(record, [r for r in records if r.behind == record.url]))
    findings.extend(check_pairs(records))
    return PreflightReport(tuple(records), tuple(findings), tuple(unreadable))


def run_preflight(args: argparse.Namespace, transport: httpx.BaseTransport | None = None) -> int:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    # trust_env=False: limits must come from the engine itself, not via a
    # proxy picked up from the environment.
    with httpx.Client(timeout=args.timeout, headers=headers, transport=transport, trust_env=False) as client:
        report = audit([EngineTarget.parse(spec) for spec in args.urls], client)
    print(render_json(report) if args.json else render_table(report))
    if report.exit_code == EXIT_UNREACHABLE and not args.json:
        print("exit 2: at least one engine could not be read; its limits are unchecked", file=sys.stderr)
    return report.exit_code
