"""Soak with canaries: many tenants, mixed load, then drain and count what was lost.

    python bench/soak.py                                  # 120 s, 8 tenants, disaggregated
    python bench/soak.py --duration 30 --role colocated --json out.json

Starts its own server (poisoned scrubbing, one API key per tenant), warms it
up with one prompt at the limit, then drives the mixed load of
`bench/soak_load.py` for --duration seconds on loopback while sampling the
resident memory of every server process. Afterwards it waits for the server
to drain and reports:

  requests served, typed rejections, errors by kind
  cross-tenant canary hits          must be 0
  over-length requests served (200) must be 0 (the incident)
  steps failed closed               must be 0 (with poison, any stale KV read fails a step)
  pages leaked after drain          must be 0 (owned + dirty pages left on every pool)
  memory growth, last vs first third of the run   must stay under --max-growth

Exit 1 when a must-be-zero figure is not zero or memory grew.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proc_memory import MemoryTrace  # noqa: E402
from bench.soak_load import Limits, SoakLoad  # noqa: E402

# Why 10%: the KV pools are preallocated, so a healthy server's RSS moves only
# with allocator caching (+2 to +3% after the warm-up at the limit). 10% of the
# ~3.2 GB tree is ~320 MB: over the ~80 requests of a 90 s soak on two cores
# that catches leaks of a few MB per request (one request's KV pages are tens
# of MB); smaller leaks need a longer --duration.
DEFAULT_MAX_GROWTH = 0.10
DRAIN_TIMEOUT_S = 60.0  # longer than the soak server's --drain-lease plus a request timeout's tail
SAMPLE_EVERY_S = 0.5


def tenant_keys(n: int) -> dict[str, str]:
    return {f"sk-soak-{i}": f"tenant-{i}" for i in range(n)}


def write_keys(keys: dict[str, str], path: Path) -> Path:
    path.write_text("[keys]\n" + "".join(f'"{k}" = "{t}"\n' for k, t in keys.items()))
    return path


def server_flags(role: str, keys_file: Path, context_length: int) -> list[str]:
    return ["--role", role, "--api-keys", str(keys_file), "--scrub-mode", "poison", "--kv-memory", "256MiB",
            "--context-length", str(context_length), "--drain-lease", "5", "--max-running", "16"]


def pools_holding_pages(info: dict) -> dict[str, int]:
    """owned + dirty pages on every pool: the router's workers, or the colocated engine."""
    pools = info.get("workers") or [dict(info, name=info.get("role", "engine"))]
    return {p["name"]: p["owned_pages"] + p["dirty_pages"] for p in pools}


def drain(server, timeout_s: float = DRAIN_TIMEOUT_S) -> dict[str, int]:
    """Wait until no pool holds pages; what is left after timeout_s is leaked."""
    deadline = time.monotonic() + timeout_s
    clean_polls = 0
    while True:
        held = pools_holding_pages(server.info())
        # Two clean polls a heartbeat apart: worker figures reach the router by heartbeat.
        clean_polls = clean_polls + 1 if not any(held.values()) else 0
        if clean_polls >= 2 or time.monotonic() > deadline:
            return held
        time.sleep(0.6)


@dataclass
class SoakReport:
    role: str
    tenants: int
    concurrency: int
    duration_s: float
    requests_started: dict
    requests_served: int
    served_by_kind: dict
    rejections: dict
    errors: dict
    disconnects: int
    cancels: int
    server_disconnects_seen: int  # 499s the server counted: the client really left
    canary_echoes: int
    cross_tenant_hits: list
    steps_failed_closed: int
    pages_leaked: dict
    rss_peak_mb: float
    rss_growth: float
    max_growth: float
    longest_prompt_tokens: int
    context_length: int
    failures: list = field(default_factory=list)

    def judge(self) -> SoakReport:
        f = []
        if self.cross_tenant_hits:
            f.append(f"{len(self.cross_tenant_hits)} cross-tenant canary hits")
        if self.errors.get("over_length_served"):
            f.append(f"{self.errors['over_length_served']} over-length requests served")
        if self.steps_failed_closed:
            f.append(f"{self.steps_failed_closed} steps failed closed (stale KV read under poison)")
        if sum(self.pages_leaked.values()):
            f.append(f"pages leaked after drain: {self.pages_leaked}")
        if self.rss_growth > self.max_growth:
            f.append(f"memory grew {self.rss_growth:.1%} (limit {self.max_growth:.0%})")
        self.failures = f
        return self


def warm_up(url: str, key: str, tokenizer, limits: Limits) -> None:
    """One prompt at the limit, so allocator high-water marks are set before memory is sampled."""
    import httpx

    ids = tokenizer.encode("The quiet river runs past the old mill. " * limits.context_length)
    ids = ids[: limits.context_length - 2]
    r = httpx.post(url + "/v1/completions", json={"prompt": ids, "max_tokens": 2, "temperature": 0},
                   headers={"Authorization": f"Bearer {key}"}, timeout=600)
    r.raise_for_status()


def run_soak(server, keys: dict[str, str], duration_s: float, concurrency: int, role: str,
             max_growth: float = DEFAULT_MAX_GROWTH, seed: int = 0) -> SoakReport:
    """Drive the load against a started server (poison scrub, these keys) and judge it."""
    from bulkhead.model.gguf_import import default_model_dir
    from bulkhead.model.tokenizer import Tokenizer

    info = server.info()
    limits = Limits(info["context_length"], info["max_input_tokens"])
    tokenizer = Tokenizer(default_model_dir())
    warm_up(server.url, next(iter(keys)), tokenizer, limits)
    failures_before = server.metric("bulkhead_engine_failures_total")
    disconnects_before = server.metric("bulkhead_requests_total", status="499")

    trace = MemoryTrace(server.proc.pid)
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            trace.sample()
            stop.wait(SAMPLE_EVERY_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    load = SoakLoad(server.url, keys, limits, tokenizer, seed=seed)
    start = time.monotonic()
    try:
        tally = asyncio.run(load.run(duration_s, concurrency))
    finally:
        stop.set()
        sampler.join()
    elapsed = time.monotonic() - start
    leaked = drain(server)
    return SoakReport(
        role=role, tenants=len(set(keys.values())), concurrency=concurrency, duration_s=round(elapsed, 1),
        requests_started=dict(tally.started), requests_served=tally.requests_served,
        served_by_kind=dict(tally.served), rejections=dict(tally.rejections), errors=dict(tally.errors),
        disconnects=tally.disconnects, cancels=tally.cancels,
        server_disconnects_seen=int(server.metric("bulkhead_requests_total", status="499") - disconnects_before),
        canary_echoes=load.ledger.echoes, cross_tenant_hits=[asdict(h) for h in load.ledger.hits],
        steps_failed_closed=int(server.metric("bulkhead_engine_failures_total") - failures_before),
        pages_leaked=leaked, rss_peak_mb=round(trace.peak / 2**20, 1), rss_growth=round(trace.growth, 4),
        max_growth=max_growth, longest_prompt_tokens=tally.prompt_tokens_max, context_length=limits.context_length,
    ).judge()


def render(r: SoakReport) -> str:
    rows = [
        ("load", f"{r.requests_served} served of {sum(r.requests_started.values())} sent, {r.tenants} tenants, "
                 f"concurrency {r.concurrency}, {r.duration_s:.0f} s, {r.role}"),
        ("served by kind", ", ".join(f"{k} {v}" for k, v in sorted(r.served_by_kind.items())) or "-"),
        ("typed rejections", ", ".join(f"{k} {v}" for k, v in sorted(r.rejections.items())) or "0"),
        ("client disconnects", f"{r.disconnects} mid-stream, {r.cancels} cancelled "
                               f"({r.server_disconnects_seen} seen by the server)"),
        ("errors by kind", ", ".join(f"{k} {v}" for k, v in sorted(r.errors.items())) or "0"),
        ("cross-tenant canary hits", f"{len(r.cross_tenant_hits)}   (must be 0; {r.canary_echoes} responses "
                                     f"echoed their own canary)"),
        ("steps failed closed", f"{r.steps_failed_closed}   (must be 0)"),
        ("pages leaked after drain", f"{sum(r.pages_leaked.values())}   (must be 0; pools: "
                                     + ", ".join(f"{k} {v}" for k, v in r.pages_leaked.items()) + ")"),
        ("server RSS", f"peak {r.rss_peak_mb:.0f} MiB, last vs first third {r.rss_growth:+.1%} "
                       f"(must stay under {r.max_growth:.0%})"),
        ("longest prompt", f"{r.longest_prompt_tokens} tokens (context {r.context_length})"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append("PASS" if not r.failures else "FAIL: " + "; ".join(r.failures))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from tests.server_process import ServerProcess

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of load (default 120)")
    ap.add_argument("--tenants", type=int, default=8, help="API keys, one tenant each (default 8)")
    ap.add_argument("--concurrency", type=int, default=8, help="clients sending back to back (default 8)")
    ap.add_argument("--role", choices=("local", "colocated"), default="local",
                    help="local = router + prefill + decode processes (default); colocated = one process")
    ap.add_argument("--context-length", type=int, default=1024)
    ap.add_argument("--max-growth", type=float, default=DEFAULT_MAX_GROWTH,
                    help="largest allowed RSS growth, last third of the run vs the first (default 0.10)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write the report here")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="server log directory")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    keys = tenant_keys(args.tenants)
    keys_file = write_keys(keys, args.out / "soak-keys.toml")
    server = ServerProcess(server_flags(args.role, keys_file, args.context_length),
                           args.out / f"soak-{args.role}.log").wait_ready(timeout=300)
    try:
        report = run_soak(server, keys, args.duration, args.concurrency, args.role, args.max_growth, args.seed)
    finally:
        server.stop()
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=2))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
