"""Where the served first wave's time goes on the default deployment: a timeline.

    python bench/ttft_timeline.py                              # 16 clients x 2, 256-token prompts, 128 out
    python bench/ttft_timeline.py --checkouts .,/tmp/base --rounds 3   # A/B, interleaved

Serves `bulkhead serve` (router + prefill worker + decode worker, the core
lease, guards on) from each checkout in turn and runs bench/peers.py's
workload against it (closed-loop streaming clients). Every process of the
deployment loads bench/timeline_hooks (through PYTHONPATH's sitecustomize)
and writes an event per engine pass (wall, the engine thread's CPU time,
the process's CPU time, its prompts and decode rows), per core-lease turn
(asked, granted, ended) and per hand-off (assign, hand-over, grant,
transfer, commit, first output), on the host's monotonic clock, which the
client reads too. Prints each checkout's TTFT (median, p99) and throughput,
and for the first wave: where the last first token's time went (prefill
passes, decode passes, and time in which neither engine ran a pass) and
the hand-off chain of its slowest request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HOOKS = ROOT / "bench" / "timeline_hooks"
CHAIN = ("r_assign", "p_assign", "pass_start", "p_out", "d_ready", "d_granted", "p_granted", "p_xfer0",
         "d_done", "d_checked", "d_first", "r_first", "client_first")


async def one_request(http, url: str, ids: list[int], output_tokens: int) -> dict:
    body = {"model": "bench", "prompt": ids, "max_tokens": output_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    start, first, rid, tokens = time.monotonic(), None, None, 0
    async with http.stream("POST", url + "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):
                first = first or time.monotonic()
                rid = rid or chunk["id"]
                tokens += 1
    return {"start": start, "first": first, "end": time.monotonic(), "id": rid, "tokens": tokens}


async def closed_loop(url: str, prompts: list[list[int]], clients: int, output_tokens: int) -> tuple[list, float]:
    queue, records = list(reversed(prompts)), []

    async def client(http, wave_index):
        while queue:
            records.append(await one_request(http, url, queue.pop(), output_tokens))

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_keepalive_connections=0)) as http:
        t0 = time.monotonic()
        await asyncio.gather(*(client(http, i) for i in range(clients)))
        return records, time.monotonic() - t0


def serve(checkout: Path, events: Path, log: Path, server_args: list[str]) -> tuple[subprocess.Popen, str]:
    from tests.server_process import OPERATOR_ENV, free_port

    port = free_port()
    env = {**os.environ, **OPERATOR_ENV, "BULKHEAD_TIMELINE": str(events),
           "PYTHONPATH": os.pathsep.join([str(HOOKS), str(checkout)])}
    cmd = [sys.executable, "-m", "bulkhead.cli", "serve", "--port", str(port), "--model-id", "bench",
           "--kv-memory", str(2**30), "--context-length", "2048", *server_args]
    proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):  # bounded: 10 minutes
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise TimeoutError("server not ready")


def read_events(folder: Path) -> list[dict]:
    return sorted((json.loads(line) for f in folder.glob("tl-*.jsonl") for line in f.read_text().splitlines()
                   if line.strip()), key=lambda e: e["t"])


def first_wave(records: list[dict], events: list[dict], clients: int) -> dict:
    """The wave's span, where it went, and its slowest request's chain."""
    wave = sorted(records, key=lambda r: r["start"])[:clients]
    t0, t1 = min(r["start"] for r in wave), max(r["first"] for r in wave)
    passes = [e for e in events if e["ev"] == "pass" and e["t0"] < t1 and e["t"] > t0]
    busy = {"prefill": 0.0, "decode": 0.0}
    cpu = {"prefill": 0.0, "decode": 0.0}
    for p in passes:
        busy[p["role"]] += min(p["t"], t1) - max(p["t0"], t0)
        cpu[p["role"]] += p["cpu"]
    intervals = sorted((max(p["t0"], t0), min(p["t"], t1)) for p in passes)
    covered, end = 0.0, t0
    for a, b in intervals:
        if b > end:
            covered += b - max(a, end)
            end = b
    prefill = [p for p in passes if p["role"] == "prefill"]
    slow = max(wave, key=lambda r: r["first"] - r["start"])
    rid = next((e["rid"] for e in events if e["ev"] == "r_assign" and e["rid"].startswith(slow["id"])), None)
    chain = {e["ev"]: e["t"] for e in events if e.get("rid") == rid}
    own = next((p for p in prefill if rid in p["prefills"]), None)
    if own:
        chain["pass_start"], chain["pass_end"] = own["t0"], own["t"]
    chain["client_first"] = slow["first"]
    return {"span": t1 - t0, "busy": busy, "cpu": cpu, "idle": (t1 - t0) - covered,
            "prefill_passes": [(round(p["t0"] - t0, 3), round(p["t"] - p["t0"], 3), round(p["cpu"], 3),
                                round(p["pcpu"], 3), sorted(p["prefills"].values())) for p in prefill],
            "decode_passes": sum(1 for p in passes if p["role"] == "decode"),
            "slowest": {k: round(chain[k] - slow["start"], 3) for k in CHAIN + ("pass_end",) if k in chain}}


def one_round(checkout: Path, args, prompts: list[list[int]], out: Path) -> dict:
    events = Path(tempfile.mkdtemp(prefix="tl-", dir=out))
    proc, url = serve(checkout, events, events / "server.log", args.server_args.split())
    try:
        asyncio.run(closed_loop(url, [prompts[0][::-1]], 1, 4))  # warm-up, an unseen prompt
        for f in events.glob("tl-*.jsonl"):
            f.write_text("")
        records, wall = asyncio.run(closed_loop(url, prompts, args.clients, args.output_tokens))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    ttft = sorted(r["first"] - r["start"] for r in records)
    return {"checkout": str(checkout), "p99": ttft[min(len(ttft) - 1, round(0.99 * (len(ttft) - 1)))],
            "median": statistics.median(ttft), "tok_s": sum(r["tokens"] for r in records) / wall,
            "wave": first_wave(records, read_events(events), args.clients)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkouts", default=".", help="comma list of checkouts, served in turn each round")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--server-args", default="", help="extra `bulkhead serve` flags")
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()))
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer

    from bench.workload import make_prompts
    from bulkhead.model.gguf_import import default_model_dir

    tok = Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))
    prompts = [p.ids for p in make_prompts(tok, args.clients * args.requests_per_client, args.prompt_tokens, 0)]
    checkouts = [Path(c).resolve() for c in args.checkouts.split(",")]
    results = []
    for n in range(args.rounds):
        for checkout in (checkouts if n % 2 == 0 else checkouts[::-1]):
            r = one_round(checkout, args, prompts, args.out)
            results.append(r)
            print(json.dumps(r), flush=True)
    for c in checkouts:
        mine = [r for r in results if r["checkout"] == str(c)]
        p99 = " ".join(f"{r['p99']:.2f}" for r in mine)
        tok_s = " ".join(f"{r['tok_s']:.1f}" for r in mine)
        print(f"{c}: p99 TTFT {p99} s, tok/s {tok_s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
