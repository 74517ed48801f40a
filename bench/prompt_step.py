"""Time one step of prompts in process, as the engine computes it.

    python bench/prompt_step.py                              # two 256-token prompts, default kernels
    python bench/prompt_step.py --prompts 1,2,4 --tokens 256
    python bench/prompt_step.py --linear-kernel auto,q4 --reps 20   # A/B, interleaved
    python bench/prompt_step.py --threads 1 --cpu-time --parts     # where the time goes (bench/prompt_parts.py)
    perf record -g python bench/prompt_step.py --reps 40     # a profile (docs/performance.md, Figures)

Builds the engine as `bulkhead serve` does (`build_engine`: the kernel
choice, the prompt attention and glue, whether a step's prompts share one
pass, every guard on) and times `ModelRunner.run` on a step of N new
prompts of T tokens each: random token ids from a fixed seed (a prompt
pass's cost does not depend on which). Each step's pages are released and
scrubbed afterwards, outside the timing, as the engine scrubs them between
steps. Variants named together run interleaved, rep by rep, in this one
process: on a shared machine only such A/B figures mean anything. Prints
the median and quartiles per variant and step size, and the median per
1,000 prompt tokens.

A 16-client burst is eight steps of two 256-token prompts (the default
step budget), so `--prompts 2 --tokens 256` is the step that sets the
16-client level's p99 time to first token.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.prompt_parts import PARTS, PartTimer, hot_rate, linear_flops  # noqa: E402
from bulkhead.engine.builder import EngineConfig, build_engine  # noqa: E402
from bulkhead.engine.scheduler import PrefillWork, StepPlan  # noqa: E402
from bulkhead.kv.layout import KVLayout  # noqa: E402
from bulkhead.kv.pool import scrub_released  # noqa: E402
from bulkhead.model.config import load_model_config  # noqa: E402
from bulkhead.model.gguf_import import default_model_dir  # noqa: E402

# Prompt ids are drawn from this range: ordinary tokens of the bundled
# SmolLM2's vocabulary, clear of its special tokens at the start.
FIRST_ID, LAST_ID = 1000, 30000


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default="2", help="comma list: prompts a step")
    ap.add_argument("--tokens", type=int, default=256, help="tokens a prompt")
    ap.add_argument("--linear-kernel", default="auto", help="comma list: variants to run interleaved")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--model", type=Path, default=None, help="a model directory (default: the bundled SmolLM2)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time the step in this thread's CPU time, not wall time: with --threads 1, what a step "
                         "costs without the time a busy machine keeps it waiting (as bench/decode_step.py)")
    ap.add_argument("--parts", action="store_true",
                    help="also each part's share of a step (bench/prompt_parts.py) and the linears' GFLOP/s "
                         "against the same kernel's on a hot-cache layer")
    return ap


def build(model_dir: Path, kernel: str, prompts: int, tokens: int):
    """The engine's runner for `kernel`, with pages for `prompts` prompts of `tokens` tokens."""
    mc = load_model_config(model_dir)
    page_size = EngineConfig.page_size  # the dataclass default, as `bulkhead serve` uses it
    # Sized in fp32, the largest KV element, whatever dtype the cache takes.
    fp32 = KVLayout(mc.num_layers, mc.num_kv_heads, mc.head_dim, page_size, "float32")
    built = build_engine(EngineConfig(model_dir=model_dir, model_id="bench", linear_kernel=kernel,
                                      kv_memory_bytes=prompts * fp32.pages_for_tokens(tokens) * fp32.bytes_per_page,
                                      clamp_context_length=True))
    return built.engine.runner, built.linear_kernel


CLOCK = time.perf_counter  # main() sets time.thread_time for --cpu-time


def step(runner, prompts: list[tuple[int, ...]]) -> float:
    """Seconds for one step computing every prompt whole; its pages go back afterwards."""
    ledger, page_size = runner.ledger, runner.page_size
    works = []
    try:
        for i, ids in enumerate(prompts):
            pages = tuple(ledger.allocate(f"p{i}", "bench", -(-len(ids) // page_size)))
            works.append(PrefillWork(f"p{i}", "bench", 0, ids, pages, True))
        start = CLOCK()
        runner.run(StepPlan(tuple(works), (), ()))
        return CLOCK() - start
    finally:
        for w in works:
            ledger.release(w.request_id)
        scrub_released(runner.pool, ledger)


def measure(kernels: list[str], sizes: list[int], tokens: int, reps: int, model_dir: Path,
            parts: dict | None = None) -> dict:
    """{(variant, prompts a step): [milliseconds]}, variants interleaved rep by rep;
    `parts`, where given, gets {(variant, prompts a step): {part: total ms}} and
    {variant: runner} under "runners"."""
    variants = {}
    for kernel in kernels:
        runner, chosen = build(model_dir, kernel, max(sizes), tokens)
        name = f"{chosen}/shared={runner.config.batch_prompts}"
        variants[name if name not in variants else f"{name}#{len(variants)}"] = runner
    rng = random.Random(0)
    vocab = next(iter(variants.values())).model.config.vocab_size
    prompts = [tuple(rng.randrange(FIRST_ID, min(vocab, LAST_ID)) for _ in range(tokens)) for _ in range(max(sizes))]
    times = {(v, n): [] for v in variants for n in sizes}
    for n in sizes:
        for runner in variants.values():
            step(runner, prompts[:n])  # warm-up: first-call allocations and kernel builds
        for _ in range(reps):
            for v, runner in variants.items():
                if parts is None:
                    times[(v, n)].append(step(runner, prompts[:n]) * 1000)
                    continue
                with PartTimer(CLOCK).installed() as timer:
                    times[(v, n)].append(step(runner, prompts[:n]) * 1000)
                spent = parts.setdefault((v, n), dict.fromkeys(PARTS, 0.0))
                for part, seconds in timer.spent.items():
                    spent[part] += seconds * 1000
                spent["rest"] += times[(v, n)][-1] - sum(timer.spent.values()) * 1000
    if parts is not None:
        parts["runners"] = variants
    return times


def main(argv=None) -> int:
    global CLOCK
    args = parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    CLOCK = time.thread_time if args.cpu_time else time.perf_counter
    sizes = [int(x) for x in args.prompts.split(",")]
    if min(sizes) < 1 or args.tokens < 1 or args.reps < 1:
        parser().error("--prompts, --tokens and --reps must be positive")
    parts = {} if args.parts else None
    times = measure(args.linear_kernel.split(","), sizes, args.tokens, args.reps, args.model or default_model_dir(),
                    parts)
    print(f"threads {torch.get_num_threads()}, {args.tokens}-token prompts, {args.reps} reps interleaved, "
          f"{'CPU' if args.cpu_time else 'wall'} time")
    for (v, n), ts in times.items():
        q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
        median = statistics.median(ts)
        print(f"{v:<28} {n:>2} prompts: median {median:7.1f} ms (quartiles {q[0]:.1f}..{q[2]:.1f}), "
              f"{median * 1000 / (n * args.tokens):.1f} ms per 1,000 prompt tokens")
    if parts is not None:
        print_parts(parts, args.tokens, args.reps)
    return 0


def print_parts(parts: dict, tokens: int, reps: int) -> None:
    """Each variant's mean ms per part and share of the step, and its linears'
    GFLOP/s beside the same kernel's on a hot-cache layer (its down projection)."""
    runners = parts.pop("runners")
    for (v, n), spent in parts.items():
        model = runners[v].model
        total = sum(spent.values())
        rate = linear_flops(model.config, n * tokens) / (spent["linears"] / 1000 / reps) / 1e9
        hot = hot_rate(model.weights.layers[0].down, n * tokens, clock=CLOCK)
        print(f"{v} {n} prompts: " + ", ".join(f"{p} {ms / reps:.1f} ms ({100 * ms / total:.0f}%)"
                                              for p, ms in spent.items()))
        print(f"  linears {rate:.0f} GFLOP/s; the same kernel on a hot-cache layer ({n * tokens} rows): {hot:.0f}")


if __name__ == "__main__":
    sys.exit(main())
