"""Where a served token's time goes outside the model step, at one client.

    python bench/token_overhead.py                               # this checkout, 3 rounds
    python bench/token_overhead.py --checkouts .,/tmp/base       # an A/B, interleaved round by round
    python bench/token_overhead.py --model FILE.gguf --threads 0 # a real model, torch's threads

Runs the default deployment (`serve --role local`: router, prefill and
decode processes) on a tiny random Llama (2 layers, hidden 64, SmolLM2's
tokenizer) with one torch thread: a decode step then costs a fraction of a
millisecond and no OpenMP team waits at a barrier, so one client's time per
output token (TPOT) is mostly the path around the step: the engine's own
Python, emission, the decode worker's link thread, ZeroMQ, the router's link
thread and event loop, SSE and HTTP. One client streams --requests requests
of --prompt-tokens token ids and --output-tokens tokens (ignore_eos). Per
round and checkout this prints the median TPOT and, per process and thread,
the CPU time and the voluntary and involuntary context switches per output
token, read from /proc before and after the requests (after one warm-up
request). Threads are named by py-spy where it is installed, else by their
/proc name.

Several checkouts (--checkouts) run in turn, their order reversed every
other round; each server runs that checkout's code (PYTHONPATH), so compare
a change with its parent's worktree (`git worktree add /tmp/base HEAD~1`).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from context_switches import Counters, thread_counters  # noqa: E402
from proc_memory import descendants  # noqa: E402

TINY = dict(hidden=64, layers=2, heads=4, kv_heads=2, ff=128, context=2048)  # big_checkpoint.Shape's fields


def tiny_model(out: Path) -> Path:
    """The tiny random checkpoint (bf16 safetensors), written once into out."""
    from big_checkpoint import Shape, write_safetensors

    if not (out / "config.json").exists():
        write_safetensors(out, Shape(**TINY))
    return out


def role_of(pid: int, root: int) -> str:
    if pid == root:
        return "router"
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return str(pid)
    return args[args.index("--role") + 1] if "--role" in args[:-1] else str(pid)


def thread_names(pid: int) -> dict[int, str]:
    """tid -> Python thread name (py-spy), else the thread's /proc name."""
    names = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            names[int(tid)] = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy:
        dump = subprocess.run([spy, "dump", "--nonblocking", "-p", str(pid)], capture_output=True, text=True).stdout
        names |= {int(m[1]): m[2] for m in re.finditer(r'Thread (\d+) \([^)]*\): "([^"]+)"', dump)}
    return names


def per_thread(before: dict[int, Counters], after: dict[int, Counters], names: dict[int, str]) -> dict[str, Counters]:
    """What each named thread did between the readings (same-named threads summed; one born meanwhile counts from zero)."""
    out: dict[str, Counters] = defaultdict(Counters)
    for tid, now in after.items():
        out[names.get(tid, str(tid))] += now - before.get(tid, Counters())
    return dict(out)


def stream_one(url: str, prompt: list[int], tokens: int) -> float:
    """One streamed completion's TPOT in seconds: (last chunk - first chunk) / (chunks - 1)."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    stamps = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and '"text"' in line:
                stamps.append(time.perf_counter())
    if len(stamps) != tokens:
        raise RuntimeError(f"{len(stamps)} chunks for {tokens} tokens")
    return (stamps[-1] - stamps[0]) / (tokens - 1)


def serve(checkout: Path, model: Path, threads: int, port: int, log: Path) -> subprocess.Popen:
    flags = ["--role", "local", "--port", str(port), "--model", str(model), "--model-id", "bench",
             "--kv-memory", "256MiB", "--context-length", "1024"] + (["--threads", str(threads)] if threads else [])
    proc = subprocess.Popen([sys.executable, "-m", "bulkhead.cli", "serve", *flags], cwd=checkout,
                            env={**os.environ, "PYTHONPATH": str(checkout)}, stdout=log.open("w"),
                            stderr=subprocess.STDOUT)
    for _ in range(600):  # bounded: 10 minutes
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.terminate()
    raise RuntimeError(f"server not ready in 10 minutes: see {log}")


def measure(checkout: Path, args, model: Path, port: int) -> str:
    proc = serve(checkout, model, args.threads, port, args.out / f"token-overhead-{port}.log")
    try:
        url = f"http://127.0.0.1:{port}"
        prompt = list(range(1000, 1000 + args.prompt_tokens))
        stream_one(url, prompt, 8)  # warm-up
        pids = descendants(proc.pid)
        names = {pid: thread_names(pid) for pid in pids}
        roles = {pid: role_of(pid, proc.pid) for pid in pids}
        before = {pid: thread_counters(pid) for pid in pids}
        tpots = [stream_one(url, prompt, args.output_tokens) for _ in range(args.requests)]
        after = {pid: thread_counters(pid) for pid in pids}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    n = args.requests * args.output_tokens
    lines = [f"{str(checkout):<28} TPOT median {statistics.median(tpots) * 1e3:7.3f} ms  "
             f"(load {os.getloadavg()[0]:.1f})"]
    rows = [(roles[pid], name, c) for pid in pids
            for name, c in per_thread(before[pid], after[pid], names[pid]).items()]
    for role, name, c in sorted(rows, key=lambda r: -r[2].cpu_s):
        if c.cpu_s > 0 or c.voluntary > n / 10:
            lines.append(f"    {role:8} {name[:30]:30} {c.cpu_s / n * 1e3:6.3f} ms CPU  "
                         f"{c.voluntary / n:5.2f} voluntary  {c.involuntary / n:5.2f} involuntary  per token")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkouts", default=str(ROOT), help="comma list of repository directories to compare")
    ap.add_argument("--model", type=Path, default=None, help="default: the tiny random model (written to --out)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per model process; 0: torch's")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--port", type=int, default=18480)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or tiny_model(args.out / "tiny-llama")
    checkouts = [Path(c).resolve() for c in args.checkouts.split(",") if c]
    for r in range(args.rounds):
        for checkout in checkouts if r % 2 == 0 else checkouts[::-1]:
            print(f"round {r}: " + measure(checkout, args, model, args.port), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
