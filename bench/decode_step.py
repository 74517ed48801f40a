"""Time one decode step in process, and where it goes.

    python bench/decode_step.py                         # 1 and 16 requests, default kernels
    python bench/decode_step.py --requests 1 --profile  # torch.profiler's op table too
    python bench/decode_step.py --linear-kernel onednn,auto --reps 30   # A/B, interleaved
    python bench/decode_step.py --decode-glue c,torch --kv-dtype bfloat16,bfloat16   # the C layers vs torch ops
    python bench/decode_step.py --requests 16 --processes 12   # one median per fresh process

Builds the model and runner as the engine does (kernel choice, measured row
multiple, guards on), fills each request's KV with random values instead of
running its prompt (a decode step's cost does not depend on the values), and
times `ModelRunner.run` on decode plans. Variants named together run
interleaved, rep by rep, in this one process: on a shared machine only such
A/B figures mean anything. Prints the median and quartiles per variant.

--processes N runs the same measurement in N fresh processes, one after
another, and prints each one's medians: a cost that a process settles into
at start-up and keeps (a buffer's placement, say) shows as runs that differ
from each other while each is steady (docs/performance.md, "The slow spell
was false sharing").
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bulkhead.engine.builder import EngineConfig, _decode_row_multiple  # noqa: E402
from bulkhead.engine.runner import ModelRunner, RunnerConfig  # noqa: E402
from bulkhead.engine.scheduler import DecodeWork, StepPlan  # noqa: E402
from bulkhead.kv.layout import KVLayout  # noqa: E402
from bulkhead.kv.ledger import PageLedger  # noqa: E402
from bulkhead.kv.pool import KVPool  # noqa: E402
from bulkhead.model import decode_kernel  # noqa: E402
from bulkhead.model.gguf_import import default_model_dir, resolve_model  # noqa: E402
from bulkhead.model.llama import LlamaModel  # noqa: E402
from bulkhead.model.prepared_weights import load_laid_out  # noqa: E402


def build(kernel: str, head_kernel: str | None, max_requests: int, context: int, kv_dtype: str = "float32",
          glue: str = "auto", model_dir: Path | None = None):
    model_dir = resolve_model(model_dir) if model_dir else default_model_dir()
    # As the engine lays them out: from this machine's cache where the kernels are cached (on huge pages).
    mc, prepared, chosen, _ = load_laid_out(model_dir, torch.float32, kernel, head_kernel)
    attention = decode_kernel.choose("auto", kv_dtype, mc.num_heads, mc.num_kv_heads, mc.head_dim, 16)
    model = LlamaModel(mc, prepared, attention, glue)
    layout = KVLayout(mc.num_layers, mc.num_kv_heads, mc.head_dim, 16, kv_dtype)
    pages_each = -(-(context + 8) // 16)
    pool, ledger = KVPool(layout, pages_each * max_requests + 1), PageLedger(pages_each * max_requests + 1)
    pool.data.normal_(0, 1)
    multiple = _decode_row_multiple(model, EngineConfig(Path("."), "x", 0, max_running=max(16, max_requests)))
    runner = ModelRunner(model, pool, ledger, RunnerConfig(decode_row_multiple=multiple))
    pages = [tuple(ledger.allocate(f"r{i}", "t", pages_each)) for i in range(max_requests)]
    return runner, pages, chosen


def plan(pages, n: int, context: int) -> StepPlan:
    return StepPlan(None, tuple(DecodeWork(f"r{i}", "t", context, 1000 + i, pages[i]) for i in range(n)), ())


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", default="1,16", help="comma list of decode batch sizes")
    ap.add_argument("--context", type=int, default=320, help="KV positions per request")
    ap.add_argument("--linear-kernel", default="auto", help="comma list: variants to run interleaved")
    ap.add_argument("--head-kernel", default="", help="comma list, one per variant: lm_head kernel, fp32, bf16w or q8-i16in ('' = the kernel's default)")
    ap.add_argument("--kv-dtype", default="", help="comma list, one per variant: the KV cache's dtype "
                                                   "('' = float32)")
    ap.add_argument("--decode-glue", default="", help="comma list, one per variant: auto, c or torch "
                                                      "('' = auto)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--model", type=Path, default=None,
                    help="a model directory or GGUF file (default: the bundled SmolLM2)")
    ap.add_argument("--profile", action="store_true", help="print torch.profiler's top ops per variant")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time the step in this thread's CPU time, not wall time: with --threads 1, what a step "
                         "costs without the time a busy machine keeps it waiting")
    ap.add_argument("--processes", type=int, default=1,
                    help="run the measurement in this many fresh processes, one after another, and print each "
                         "one's medians (not with --profile)")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.processes > 1:
        if args.profile:
            ap.error("--profile prints one process's tables: run it without --processes")
        return fresh_processes(args.processes, argv if argv is not None else sys.argv[1:])
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    sizes = [int(x) for x in args.requests.split(",")]
    kernels = args.linear_kernel.split(",")
    count = max(len(kernels), len(args.decode_glue.split(",")))
    kernels = (kernels * count)[:count] if len(kernels) == 1 else kernels
    heads = (args.head_kernel.split(",") + [""] * count)[:count]
    kv_dtypes = (args.kv_dtype.split(",") + [""] * count)[:count]
    glues = (args.decode_glue.split(",") + [""] * count)[:count]
    variants = {}
    for k, h, kv, g in zip(kernels, heads, kv_dtypes, glues):
        runner, pages, chosen = build(k, h or None, max(sizes), args.context, kv or "float32", g or "auto",
                                      args.model)
        name = f"{chosen}" + (f"/head={h}" if h else "") + (f"/kv={kv}" if kv else "")
        variants[name + f"/glue={runner.model.decode_glue}"] = (runner, pages)
    times = {(v, n): [] for v in variants for n in sizes}
    for n in sizes:
        for runner, pages in variants.values():
            for _ in range(3):
                runner.run(plan(pages, n, args.context))  # warm-up: oneDNN builds its kernels
        for _ in range(args.reps):
            for v, (runner, pages) in variants.items():
                p = plan(pages, n, args.context)
                t = clock()
                runner.run(p)
                times[(v, n)].append((clock() - t) * 1000)
    print(f"threads {torch.get_num_threads()}, context {args.context}, {args.reps} reps interleaved, "
          f"{'CPU' if args.cpu_time else 'wall'} time")
    for (v, n), ts in times.items():
        q = statistics.quantiles(ts, n=4)
        print(f"{v:<28} {n:>3} requests: median {statistics.median(ts):7.2f} ms  (quartiles {q[0]:.2f}..{q[2]:.2f})")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for v, (runner, pages) in variants.items():
            for n in sizes:
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    for _ in range(5):
                        runner.run(plan(pages, n, args.context))
                print(f"\n== {v}, {n} requests, 5 steps")
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    return 0


def child_argv(argv: list[str]) -> list[str]:
    """A child's arguments: the parent's, with --processes 1 last (argparse
    keeps an option's last value, however the parent spelled or abbreviated
    it), so that a child never starts children of its own."""
    return [*argv, "--processes", "1"]


def fresh_processes(count: int, argv: list[str]) -> int:
    """Run this script `count` times, one process each; print every run's median lines."""
    for i in range(count):
        run = subprocess.run([sys.executable, __file__, *child_argv(argv)], capture_output=True, text=True)
        if run.returncode:
            print(run.stdout + run.stderr, file=sys.stderr)
            return run.returncode
        medians = [line.strip() for line in run.stdout.splitlines() if "median" in line]
        print(f"process {i + 1:>2}: " + " | ".join(medians), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
