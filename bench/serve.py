"""Closed-loop serving benchmark: bulkhead vs Hugging Face `generate`, same run.

    python bench/serve.py                      # concurrency 1, 4, 16; colocated and disaggregated
    python bench/serve.py --concurrency 16 --roles colocated --skip-hf

Each level runs C clients that send requests back to back (streaming,
greedy, ignore_eos so every request makes exactly --output-len tokens) and
reports output tokens/s, median time to first token and median time per
output token, for bulkhead colocated and disaggregated (router + prefill +
decode processes sharing the same 2 cores). transformers runs the same
prompts as one static batch of C. Ratios are to transformers: this machine
is shared and noisy, so only ratios measured in the same run mean anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bulkhead.model.gguf_import import default_model_dir  # noqa: E402
from bulkhead.server.process import ServerProcess  # noqa: E402


def make_prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1000, 40000, (length,), generator=g).tolist() for _ in range(n)]


async def one_request(http: httpx.AsyncClient, url: str, prompt: list[int], output_len: int) -> dict:
    body = {"prompt": prompt, "max_tokens": output_len, "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first = None
    tokens = 0
    async with http.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if chunk.get("choices") and first is None:
                first = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    end = time.perf_counter()
    return {"ttft": first - start, "tpot": (end - first) / max(1, tokens - 1), "tokens": tokens}


async def run_bulkhead_level(url: str, prompts: list[list[int]], concurrency: int, output_len: int) -> dict:
    queue = list(prompts)
    results = []

    async def client(http):
        while queue:
            results.append(await one_request(http, url, queue.pop(), output_len))

    async with httpx.AsyncClient(timeout=600) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return {
        "tok_s": sum(r["tokens"] for r in results) / wall,
        "ttft_median": statistics.median(r["ttft"] for r in results),
        "tpot_median": statistics.median(r["tpot"] for r in results),
        "requests": len(results),
    }


def run_hf_level(model, prompts: list[list[int]], output_len: int) -> dict:
    import torch

    ids = torch.tensor(prompts)
    with torch.no_grad():
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=output_len,
                             min_new_tokens=output_len, do_sample=False, pad_token_id=0)
        wall = time.perf_counter() - start
    made = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    return {"tok_s": made / wall, "requests": len(prompts)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="requests per client at each level")
    ap.add_argument("--roles", nargs="+", default=["colocated", "local"],
                    help="bulkhead deployments to measure: colocated, local (router + prefill + decode)")
    ap.add_argument("--url", default=None, help="benchmark a running server instead of starting them")
    ap.add_argument("--server-args", default="", help="extra `bulkhead serve` flags")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    hf = None
    if not args.skip_hf:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype="float32").eval()
    roles = ["url"] if args.url else args.roles
    results: dict[str, dict[int, dict]] = {role: {} for role in roles}
    peers: dict[int, dict] = {}
    for role in roles:
        server = None
        url = args.url
        if url is None:
            flags = ["--role", role, "--context-length", "2048", *args.server_args.split()]
            server = ServerProcess(flags, args.out / f"serve-bench-{role}.log").wait_ready(timeout=300)
            url = server.url
        try:
            for c in args.concurrency:
                prompts = make_prompts(c * args.rounds, args.prompt_len, seed=c)
                asyncio.run(run_bulkhead_level(url, prompts[:1], 1, 4))  # warm-up
                results[role][c] = asyncio.run(run_bulkhead_level(url, prompts, c, args.output_len))
                r = results[role][c]
                print(f"{role:<10} c={c:<3} {r['tok_s']:7.1f} tok/s  TTFT {r['ttft_median']:6.2f}s  "
                      f"TPOT {r['tpot_median'] * 1000:6.1f}ms", flush=True)
        finally:
            if server is not None:
                server.stop()
    if hf is not None:
        for c in args.concurrency:
            peers[c] = run_hf_level(hf, make_prompts(c, args.prompt_len, seed=c), args.output_len)
            print(f"transformers static batch {c:<3} {peers[c]['tok_s']:7.1f} tok/s", flush=True)

    print("\noutput tokens/s (ratio to transformers static batches of the same size, same run)")
    print(f"{'c':>3}  " + "  ".join(f"{role:>18}" for role in roles) + f"  {'transformers':>12}")
    for c in args.concurrency:
        cells = []
        for role in roles:
            tok_s = results[role][c]["tok_s"]
            ratio = f"{tok_s / peers[c]['tok_s']:.2f}x" if c in peers else "-"
            cells.append(f"{tok_s:9.1f} ({ratio:>6})")
        peer = f"{peers[c]['tok_s']:12.1f}" if c in peers else f"{'-':>12}"
        print(f"{c:>3}  " + "  ".join(cells) + f"  {peer}")
    path = args.out / f"serve-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)},
                                "bulkhead": results, "transformers_static": peers}, indent=2))
    print(f"raw results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
