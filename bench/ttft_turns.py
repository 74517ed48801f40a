"""Time to first token under 16 clients on the default deployment's two engines, on a clock of CPU time.

    python bench/ttft_turns.py                                  # 16 clients x 2, 256-token prompts, 128 out
    python bench/ttft_turns.py --step-tokens 0,1024 --rounds 3  # A/B of the prefill engine's step budget

bench/ttft_parts.py splits the served workload's TTFT on one colocated
engine; `make serve` runs a prefill and a decode worker that take turns with
the cores (engine/core_lease.py). This drives both engines, built as the
workers build them (guards on, the kernel table's kernels, --threads torch
threads), on the calling thread, turn by turn as the lease gives them: while
both have work their steps alternate, else the one with work steps again.
The clock is virtual: it advances by the engine thread's CPU time per step
(bench/noisy_turns.py's clock), so other processes on the machine do not
move it. Clients are closed loops (bench/peers.py's workload): client i's
first request arrives --arrival-gap-ms x i after the first (the router
hands them over one by one), its next when the last one's final token is
out. A request's TTFT runs to the prefill engine's hand-over; the KV
hand-off after it is not modelled (it runs beside the next pass). Variants
(the prefill engine's --step-tokens, 0 = as built) run whole workloads in
turn, their order reversed every other round. Prints per run the p99 and
median TTFT, the prefill passes' sizes and output tokens per CPU second.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class Deployment:
    """A prefill and a decode engine, and a virtual clock over their steps."""

    def __init__(self, args, step_tokens: int):
        from bulkhead.engine.builder import EngineConfig, build_engine
        from bulkhead.model.gguf_import import default_model_dir

        cfg = EngineConfig(model_dir=default_model_dir(), model_id="bench", kv_memory_bytes=512 * 2**20,
                           context_length=2048)
        self.pre = build_engine(replace(cfg, step_tokens=step_tokens, prefix_cache=True), prefill_only=True)
        self.dec = build_engine(cfg, decode_only=True)
        self.args, self.now, self._start = args, 0.0, None
        passes = []
        run = self.pre.engine.runner.run

        def counted(plan):
            passes.append(len(plan.prefills))
            return run(plan)

        self.pre.engine.runner.run = counted
        self.passes = passes
        self.steps: list[tuple[float, bool, float]] = []  # (end, a prefill step, CPU seconds)

    def read(self) -> float:
        return self.now + (time.thread_time() - self._start if self._start is not None else 0.0)

    def step(self, engine) -> None:
        t0, self._start = self.now, time.thread_time()
        try:
            engine.step()
        finally:
            self.now, self._start = self.read(), None
            self.steps.append((self.now, engine is self.pre.engine, self.now - t0))

    def run(self, salt: int) -> dict:
        """One workload from an idle pair; salt keeps prompts unseen by the prefix cache."""
        from bulkhead.engine.admission import admit
        from bulkhead.engine.request import SamplingParams

        a, pre, dec = self.args, self.pre.engine, self.dec.engine
        self.now, self.passes[:], self.steps[:] = 0.0, [], []
        arrivals = [(i * a.arrival_gap_ms / 1000, c, 0) for i, c in enumerate(range(a.clients))]
        arrived, first, tokens = {}, {}, [0]

        def decoded(client: int, n: int, out) -> None:
            tokens[0] += len(out.token_ids)
            if out.finished and n + 1 < a.requests_per_client:
                arrivals.append((self.read(), client, n + 1))

        def handed_over(ticket, client: int, n: int, out) -> None:
            rid = ticket.request_id
            first.setdefault(rid, self.read())
            pre.release_reserved(rid)
            dec.reserve(rid, ticket.tenant, self.dec.layout.pages_for_tokens(len(ticket.prompt_token_ids)))
            dec.submit_prefilled(ticket, out.token_ids[0], None, None, lambda o: decoded(client, n, o))

        def submit(t: float, client: int, n: int) -> None:
            rid = f"r{salt}-{client}-{n}"
            ids = [1000 + (salt * 104729 + client * 7919 + n * 15485863 + i * 31) % 29000
                   for i in range(a.prompt_tokens)]
            params = SamplingParams(max_tokens=a.output_tokens, temperature=0.0, ignore_eos=True)
            ticket = admit(rid, "t", ids, params, self.pre.limits)
            arrived[rid] = t
            pre.submit(ticket, lambda out: handed_over(ticket, client, n, out))

        last = None
        for _ in range(1_000_000):  # bounded: every step ends a prompt pass or a decode row
            for item in sorted(x for x in arrivals if x[0] <= self.now):
                arrivals.remove(item)
                submit(*item)
            pre._take_commands(block=False)
            dec._take_commands(block=False)
            ready = [e for e in (pre, dec) if e.scheduler.has_work()]
            if not ready:
                if not arrivals:
                    break
                self.now = min(x[0] for x in arrivals)
                continue
            # The lease: turns alternate while both want it; a worker alone steps again.
            engine = ready[0] if len(ready) == 1 else (dec if last is pre else pre)
            self.step(engine)
            last = engine
        ttft = sorted(first[r] - arrived[r] for r in first)
        worst = max(first, key=lambda r: first[r] - arrived[r])
        before = [s for s in self.steps if s[0] <= first[worst] + 1e-9]
        return {"p99": ttft[min(len(ttft) - 1, round(0.99 * (len(ttft) - 1)))], "median": statistics.median(ttft),
                "tok_per_cpu_s": tokens[0] / self.now, "passes": list(self.passes),
                "before_p99": (sum(s[2] for s in before if s[1]), sum(s[2] for s in before if not s[1]),
                               sum(1 for s in before if not s[1]))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step-tokens", default="0", help="comma list: the prefill engine's step budgets to compare")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--arrival-gap-ms", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    variants = [int(v) for v in args.step_tokens.split(",")]
    pairs = {v: Deployment(args, v) for v in variants}
    results = {v: [] for v in variants}
    for n in range(args.rounds):
        for v in (variants if n % 2 == 0 else variants[::-1]):
            r = pairs[v].run(salt=n * 100 + v % 97)
            results[v].append(r)
            print(f"round {n + 1}, step tokens {v}: p99 TTFT {r['p99']:.2f} CPU-s, median {r['median']:.2f}, "
                  f"{r['tok_per_cpu_s']:.1f} tok per CPU-s, prompts per pass {r['passes']}; before the slowest first "
                  f"token: prefill {r['before_p99'][0]:.2f} CPU-s, decode {r['before_p99'][1]:.2f} in "
                  f"{r['before_p99'][2]} steps", flush=True)
    for v in variants:
        rs = results[v]
        print(f"step tokens {v}: p99 TTFT median {statistics.median(r['p99'] for r in rs):.2f} CPU-s, "
              f"median TTFT {statistics.median(r['median'] for r in rs):.2f}, "
              f"{statistics.median(r['tok_per_cpu_s'] for r in rs):.1f} tok per CPU-s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
