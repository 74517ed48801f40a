"""Where time to first token goes under many clients, in one thread's CPU time.

    python bench/ttft_parts.py                      # 16 clients x 2 requests, 256-token prompts, 128 tokens
    python bench/ttft_parts.py --clients 4 --output-tokens 32

Runs bench/peers.py's served workload on one colocated engine in process
(guards on, the kernel table's kernels, one torch thread), the clock one
thread's CPU time: every client submits its first request at once and its
next when the last one ends. Each request's TTFT is split by the steps that
ran between its arrival and its first token: queued (steps before its first
prompt chunk ran), its own prompt passes, and after its first chunk, other
prompts' steps and decode-only steps. The peers' figure is the served p99
over both cores; this says which part of it a change can move.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PARTS = ("queued", "own prompt passes", "others' prompts after its start", "decode-only steps after its start")


def run_workload(args) -> tuple[list, dict, dict]:
    """steps [(t0, t1, {request: prompt tokens}, decode rows)], and each request's arrival and first token."""
    import torch

    from bulkhead.engine.admission import Admitted
    from bulkhead.engine.builder import build_engine
    from bulkhead.engine.engine_config import EngineConfig
    from bulkhead.engine.request import SamplingParams
    from bulkhead.model.gguf_import import default_model_dir, resolve_model

    torch.set_num_threads(1)
    model_dir = resolve_model(args.model) if args.model else default_model_dir()
    engine = build_engine(EngineConfig(model_dir=model_dir, model_id="m", kv_memory_bytes=256 * 2**20,
                                       context_length=2048, threads=1), decode_only=False).engine
    clock, steps, arrived, first, ended = time.thread_time, [], {}, {}, set()
    run = engine.runner.run

    def timed_run(plan):
        t0 = time.thread_time()
        out = run(plan)
        steps.append((t0, time.thread_time(), {w.request_id: len(w.token_ids) for w in plan.prefills},
                      len(plan.decode)))
        return out

    engine.runner.run = timed_run

    def submit(client: int, n: int) -> None:
        rid = f"c{client}-{n}"
        prompt = tuple(1000 + (client * 7919 + n * 104729 + i) % 20000 for i in range(args.prompt_tokens))

        def sink(out, rid=rid):
            first.setdefault(rid, clock())
            if getattr(out, "finish_reason", None):
                ended.add(rid)

        arrived[rid] = clock()
        engine.submit(Admitted(rid, "t", prompt, SamplingParams(max_tokens=args.output_tokens, temperature=0.0,
                                                                ignore_eos=True), 2048), sink)

    sent = {c: 1 for c in range(args.clients)}
    for c in sent:
        submit(c, 0)
    for _ in range(100_000):  # bounded: every step ends a prompt chunk or a decode row
        engine._take_commands(block=False)
        if len(ended) == args.clients * args.requests_per_client:
            break
        engine.step()
        for c, n in sent.items():
            if f"c{c}-{n - 1}" in ended and n < args.requests_per_client:
                sent[c] = n + 1
                submit(c, n)
    return steps, arrived, first


def split(steps: list, arrived: float, first: float, rid: str) -> tuple[float, ...]:
    """One request's TTFT by PARTS: the steps between its arrival and its first token."""
    queued = own = others = decode = 0.0
    for t0, t1, prompts, _rows in steps:
        if t1 <= arrived or t0 >= first:
            continue
        if rid in prompts:
            own += t1 - t0
        elif own == 0.0:
            queued += t1 - t0
        elif prompts:
            others += t1 - t0
        else:
            decode += t1 - t0
    return queued, own, others, decode


def report(args, steps: list, arrived: dict, first: dict) -> None:
    ttft = {r: first[r] - arrived[r] for r in first}
    ordered = sorted(ttft.values())
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    print(f"{args.clients} clients x {args.requests_per_client}, {args.prompt_tokens}-token prompts, "
          f"{args.output_tokens} tokens; one thread's CPU seconds")
    print(f"TTFT median {statistics.median(ordered):.2f}, p99 {p99:.2f}, max {ordered[-1]:.2f}")
    for n in range(args.requests_per_client):
        rids = [f"c{c}-{n}" for c in range(args.clients) if f"c{c}-{n}" in first]
        parts = list(zip(*(split(steps, arrived[r], first[r], r) for r in rids)))
        print(f"request {n + 1} of each client, median / max: "
              + "; ".join(f"{name} {statistics.median(v):.2f} / {max(v):.2f}" for name, v in zip(PARTS, parts)))
    prompt_steps = [s for s in steps if s[2]]
    decode_steps = [s for s in steps if not s[2]]
    print(f"steps carrying prompts: {len(prompt_steps)}, {sum(s[1] - s[0] for s in prompt_steps):.2f} s, "
          f"{sum(sum(s[2].values()) for s in prompt_steps)} prompt tokens, {sum(s[3] for s in prompt_steps)} "
          f"decode rows beside them; decode-only steps: {len(decode_steps)}, "
          f"{sum(s[1] - s[0] for s in decode_steps):.2f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--model", type=Path, default=None, help="a model directory or GGUF file (default: the bundled)")
    args = ap.parse_args(argv)
    report(args, *run_workload(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
