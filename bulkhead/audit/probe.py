"""`bulkhead probe`: an active leak and coherence probe against an OpenAI-compatible endpoint.

The incident's 155 leaking responses had normal HTTP codes and latency; only
their text showed the fault, so this probe looks at text: with one API key
per tenant it runs the checks docs/audit.md lists (cross_tenant,
over_length, differential, coherence, aborts, structured, and the adapter
checks of probe_adapters.py). Findings name tenants and canaries, never a
response's text. Exit 0: no findings; 1: findings; 2: the endpoint could not
be probed (unreachable, keys refused, bad input, or no completion succeeded).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import httpx

from bulkhead.audit import context_checks
from bulkhead.audit.canaries import Canaries, ProbeFinding
from bulkhead.audit.errors import AuditError, EngineResponseError
from bulkhead.audit.probe_adapters import AdapterProbe
from bulkhead.audit.probe_client import ProbeClient, ProbeInputError, Reply, load_keys
from bulkhead.audit.probe_report import EXIT_UNREACHABLE, CheckResult, ProbeReport, render_json, render_table

DEFAULT_CONCURRENCY = 8
DEFAULT_MAX_TOKENS = 16
DEFAULT_TIMEOUT_S = 120.0
ABORT_STREAMS = 4
ABORT_MAX_TOKENS = 64
CODE_SCHEMA = {"type": "object", "properties": {"reference": {"type": "string", "maxLength": 16}},
               "required": ["reference"], "additionalProperties": False}
RECORD_TOOL = {"type": "function", "function": {"name": "record_reference", "parameters": CODE_SCHEMA}}
STRUCTURED_MAX_TOKENS = 64  # a call or an object around a 16-character string
TOPICS = ("rivers", "mountains", "bread", "clocks", "lanterns", "bridges", "gardens", "ships", "maps", "bells")


@dataclass(frozen=True)
class Job:
    tenant: str
    key: str
    body: dict[str, Any]


class Probe:
    def __init__(self, client: ProbeClient, keys: dict[str, str], args: argparse.Namespace) -> None:
        self.client = client
        self.args = args
        # One key per tenant: the first one the file names.
        self.tenant_keys: dict[str, str] = {}
        for key, tenant in keys.items():
            self.tenant_keys.setdefault(tenant, key)
        self.tenants = tuple(self.tenant_keys)
        self.canaries = Canaries()
        self.model = ""
        self.failed: list[tuple[str, Reply]] = []

    # -- helpers -----------------------------------------------------------

    def _greedy(self, prompt: Any, max_tokens: int, **extra: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        if self.args.seed is not None:
            body["seed"] = self.args.seed
        if self.args.allow_divergence_after is not None:
            body["logprobs"] = 1  # token boundaries for the divergence tolerance
        body.update(extra)
        return body

    def _canary_prompt(self, tenant: str, index: int) -> str:
        canary = self.canaries.new(tenant)
        topic = TOPICS[index % len(TOPICS)]
        return f"Reference {canary}. Reference {canary}.\nWrite one short sentence about {topic}:"

    def _job(self, tenant: str, index: int, max_tokens: int) -> Job:
        """A greedy prompt carrying a new canary of tenant's."""
        return Job(tenant, self.tenant_keys[tenant], self._greedy(self._canary_prompt(tenant, index), max_tokens))

    def _jobs(self, count: int, max_tokens: int) -> list[Job]:
        """count greedy canary prompts, the tenants taking turns."""
        return [self._job(self.tenants[i % len(self.tenants)], i, max_tokens) for i in range(count)]

    def _run_all(self, jobs: list[Job], send: Callable[[str, dict[str, Any]], Reply] | None = None) -> list[Reply]:
        send = send or self.client.complete
        if not jobs:
            return []
        with ThreadPoolExecutor(max_workers=min(len(jobs), 64)) as pool:
            return list(pool.map(lambda job: send(job.key, job.body), jobs))

    def _note(self, phase: str, jobs: list[Job], replies: list[Reply]) -> None:
        for job, reply in zip(jobs, replies):
            self.canaries.scan(job.tenant, reply.text, phase)
            if not reply.ok:
                self.failed.append((phase, reply))

    # -- checks ------------------------------------------------------------

    def differential_and_leaks(self, report: ProbeReport) -> None:
        n = max(1, self.args.concurrency)
        d = min(n, 4)
        solo = self._jobs(d, self.args.max_tokens)
        solo_replies = [self.client.complete(job.key, job.body) for job in solo]
        self._note("solo", solo, solo_replies)
        if not any(r.ok for r in solo_replies):
            raise EngineResponseError(self.client.base_url, f"no completion succeeded: {solo_replies[0].failure}")
        self.solo, self.solo_replies = solo, solo_replies

        traffic = [self._job(t, i, self.args.max_tokens) for t in self.tenants for i in range(n)]
        # Interleave the repeated solo prompts evenly with every tenant's traffic.
        mixed = list(traffic)
        for j, job in enumerate(solo):
            mixed.insert((j + 1) * len(traffic) // (len(solo) + 1) + j, job)
        replies = self._run_all(mixed)
        self._note("concurrent", mixed, replies)
        again = {id(job): reply for job, reply in zip(mixed, replies) if any(job is s for s in solo)}

        cross = CheckResult("cross_tenant", len(solo) + len(mixed), detail=f"{len(self.tenants)} tenant(s), {n} "
                            "concurrent request(s) each, every prompt with its own canary")
        report.checks.append(cross)
        if len(self.tenants) < 2:
            report.skip(cross, "one tenant in the keys file: no other tenant to leak to",
                        "cross-tenant check skipped: the keys file names one tenant; give two or more")

        verdicts = [self._compare(before, again[id(job)]) for job, before in zip(solo, solo_replies)
                    if before.ok and again[id(job)].ok]
        compared, differ, tolerated = len(verdicts), verdicts.count("differ"), verdicts.count("tolerated")
        result = CheckResult("differential", len(solo) * 2,
                             detail=f"{compared} greedy prompt(s) compared solo vs among {len(traffic)} concurrent")
        if tolerated:
            result.detail += f"; {tolerated} diverged after token {self.args.allow_divergence_after} (tolerated)"
        if differ:
            tolerance = ("exact text" if self.args.allow_divergence_after is None
                         else f"the first {self.args.allow_divergence_after} token(s)")
            report.find(result, f"{differ} of {compared} greedy completion(s) changed ({tolerance}) when served "
                        "among other requests: the output depends on what else is running")
        report.checks.append(result)

    def _compare(self, before: Reply, after: Reply) -> str:
        if before.text == after.text:
            return "same"
        limit = self.args.allow_divergence_after
        if limit is None:
            return "differ"
        a = list(before.tokens) if before.tokens is not None else re.findall(r"\s+|\S+", before.text)
        b = list(after.tokens) if after.tokens is not None else re.findall(r"\s+|\S+", after.text)
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return "tolerated" if first >= limit else "differ"

    def aborts(self, report: ProbeReport) -> None:
        result = CheckResult("aborts")
        report.checks.append(result)
        k = min(ABORT_STREAMS, max(1, self.args.concurrency))
        jobs = self._jobs(k, ABORT_MAX_TOKENS)
        replies = self._run_all(jobs, send=self.client.stream_first_chunk)
        result.sent = len(jobs)
        for job, reply in zip(jobs, replies):
            self.canaries.scan(job.tenant, reply.text, "aborts")
        broken = [r for r in replies if not r.ok]
        if broken:
            report.find(result, f"{len(broken)} of {len(jobs)} stream(s) did not open: "
                        + ", ".join(sorted({r.transport_error or f'HTTP {r.status}' for r in broken})))
        # Afterwards the endpoint must still answer, and answer as it did before.
        job, before = self.solo[0], self.solo_replies[0]
        after = self.client.complete(job.key, job.body)
        result.sent += 1
        self.canaries.scan(job.tenant, after.text, "after aborts")
        if not after.ok:
            report.find(result, f"after {len(jobs)} aborted stream(s) a request got {after.failure}")
        elif before.ok and self._compare(before, after) == "differ":
            report.find(result, "after aborted streams a greedy prompt's completion changed from its solo answer")
        result.detail = f"{len(jobs)} stream(s) closed after the first chunk, then a greedy request re-checked"

    def structured(self, report: ProbeReport) -> None:
        jobs: list[Job] = []
        for i, tenant in enumerate(self.tenants):
            key = self.tenant_keys[tenant]
            for kind in ("json_schema", "tool_call"):
                body: dict[str, Any] = {"model": self.model, "max_tokens": STRUCTURED_MAX_TOKENS, "temperature": 0,
                                        "messages": [{"role": "user", "content": self._canary_prompt(tenant, i)}]}
                if kind == "json_schema":
                    body["response_format"] = {"type": "json_schema",
                                               "json_schema": {"name": "reference", "schema": CODE_SCHEMA}}
                else:
                    body |= {"tools": [RECORD_TOOL], "tool_choice": "required"}
                jobs.append(Job(tenant, key, body))
            jobs.append(self._job(tenant, i, self.args.max_tokens))
        # A chat reply's text is its content and every tool call's arguments.
        replies = self._run_all(jobs, lambda key, body: self.client.complete(
            key, body, "/v1/chat/completions" if "messages" in body else "/v1/completions"))
        for job, reply in zip(jobs, replies):
            self.canaries.scan(job.tenant, reply.text, "structured")
        chats = [(job, r) for job, r in zip(jobs, replies) if "messages" in job.body]
        result = CheckResult("structured", len(jobs), detail=f"{len(chats)} structured chat request(s) among "
                                                             f"{len(jobs) - len(chats)} completion(s)")
        served = [(job, r) for job, r in chats if r.ok]
        if not served:
            why = "the endpoint refused every structured request (no response_format or tools)"
            report.skip(result, why, "structured check skipped: " + why)
        malformed = sum(1 for job, r in served if r.finish_reason != "length" and not _shaped(job.body, r))
        if malformed:
            report.find(result, f"{malformed} of {len(served)} structured answer(s) did not parse or match "
                        "their schema")
        report.checks.append(result)

    def run(self, report: ProbeReport) -> None:
        self.differential_and_leaks(report)
        context_checks.over_length(self, report, report.context_length)
        context_checks.coherence(self, report, report.context_length)
        self.aborts(report)
        self.structured(report)
        AdapterProbe(self.client, self.tenant_keys, self.model, report.context_length).run(report)
        cross = next(c for c in report.checks if c.check == "cross_tenant")
        if self.canaries.hits:
            cross.status = "findings"
        cross.detail = f"{len(self.canaries.hits)} hit(s); " + cross.detail
        report.findings[:0] = self.canaries.hits
        if self.failed:
            by_phase: dict[str, list[str]] = {}
            for phase, reply in self.failed:
                by_phase.setdefault(phase, []).append(reply.failure)
            for phase, errors in by_phase.items():
                report.findings.append(ProbeFinding(
                    "request_failed", f"{phase}: {len(errors)} within-limit request(s) failed "
                    f"({', '.join(sorted(set(errors)))}); what they would have shown is unchecked"))


def _shaped(body: dict[str, Any], reply: Reply) -> bool:
    """A json_schema answer is an object with a string reference; a forced call's arguments are."""
    texts = reply.tool_arguments if "tools" in body else (reply.text,)
    try:
        values = [json.loads(t) for t in texts]
    except ValueError:
        return False
    return bool(values) and all(isinstance(v, dict) and isinstance(v.get("reference"), str) for v in values)


def _validate(args: argparse.Namespace) -> None:
    for name in ("concurrency", "max_tokens", "max_context"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise ProbeInputError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.allow_divergence_after is not None and args.allow_divergence_after < 0:
        raise ProbeInputError("--allow-divergence-after must be 0 or more")
    if args.context_length is not None and args.context_length < 2 * max(2, args.max_tokens):
        raise ProbeInputError("--context-length is too small to probe")


def probe(args: argparse.Namespace, transport: httpx.BaseTransport | None = None) -> ProbeReport:
    _validate(args)
    keys = load_keys(args.keys)
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    # trust_env=False: probe the endpoint itself, not a proxy from the environment.
    with httpx.Client(timeout=args.timeout, transport=transport, trust_env=False, limits=limits) as http:
        client = ProbeClient(args.url, http)
        runner = Probe(client, keys, args)
        model, context, source = client.discover(runner.tenant_keys[runner.tenants[0]], args.model)
        if args.context_length is not None:
            context, source = args.context_length, "--context-length"
        runner.model = model
        report = ProbeReport(client.base_url, model, context, source, runner.tenants)
        runner.run(report)
    return report


def run_probe(args: argparse.Namespace, transport: httpx.BaseTransport | None = None) -> int:
    try:
        report = probe(args, transport)
    except AuditError as error:
        if args.json:
            print(json.dumps({"error": str(error), "exit_code": EXIT_UNREACHABLE}, indent=2))
        print(f"probe: {error}", file=sys.stderr)
        return EXIT_UNREACHABLE
    print(render_json(report) if args.json else render_table(report))
    return report.exit_code
