"""One step under LoRA adapters, in process: where an adapter's time goes.

The bundled SmolLM2 built as `bulkhead serve` builds it (build_engine: its
default kernels, every guard on), decode rows of 1 and 16 requests, on the
C decode layers and through torch glue: the base model, and the same rows
under adapters of rank 16 on every linear layer (16 rows over four
adapters). With --prompts, also a step of two 256-token prompts (what a
16-client burst's steps hold, bench/prompt_step.py), on the base model and
under two of the adapters. With --products, the adapter levels once per
arithmetic named (bulkhead.lora.products: int8, bf16, fp32; each its own
four adapters, packed that way), so that two arithmetics are compared in
one run. The levels are interleaved, one step of each in turn, so that a
noisy neighbour slows them alike. Medians of --reps steps, milliseconds:
wall time, or with --cpu-time this thread's CPU time (with --threads 1
every kernel runs on this thread).

    .venv/bin/python -m bench.lora_step [--reps 9] [--threads 2] [--cpu-time] [--glue c] [--prompts]
                                        [--products int8,bf16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.lora_adapters import write_adapter
from bulkhead.engine.admission import AdapterRef
from bulkhead.engine.builder import EngineConfig, build_engine
from bulkhead.engine.runner import ModelRunner
from bulkhead.engine.step_plan import DecodeWork, PrefillWork, StepPlan
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.pool import scrub_released
from bulkhead.lora import products as lora_products
from bulkhead.lora.peft_files import BaseShapes, read_adapter
from bulkhead.model.config import load_model_config
from bulkhead.model.gguf_import import default_model_dir

PAGES = 320  # 16 decode rows of 4 pages, two prompts of 256 tokens, room to spare
PROMPT_TOKENS = 256


def runner_for(glue: str) -> ModelRunner:
    """The engine's runner as `bulkhead serve` builds it, with `glue` for decode steps."""
    model_dir = default_model_dir()
    mc = load_model_config(model_dir)
    fp32 = KVLayout(mc.num_layers, mc.num_kv_heads, mc.head_dim, EngineConfig.page_size, "float32")
    built = build_engine(EngineConfig(model_dir=model_dir, model_id="bench", decode_glue=glue,
                                      kv_memory_bytes=PAGES * fp32.bytes_per_page, clamp_context_length=True))
    return built.engine.runner


def load_adapters(runner: ModelRunner, work: str, products: str | None = None, first_seed: int = 0) -> list[str]:
    """Four adapters of rank 16 on every linear, in bf16 as PEFT writes them, packed for
    `products` (None: this process's default); their digests."""
    shapes = BaseShapes.of(runner.model.config)
    digests = []
    before = os.environ.get(lora_products.ENV)
    try:
        if products is not None:
            os.environ[lora_products.ENV] = products
        for i in range(first_seed, first_seed + 4):
            path = write_adapter(Path(work) / f"a{i}", shapes, rank=16, alpha=32, seed=i, scale=0.02,
                                 dtype=torch.bfloat16)
            digest = read_adapter(path, shapes).digest
            runner.adapters.acquire(AdapterRef(f"a{i}", str(path), digest))
            digests.append(digest)
    finally:
        if before is None:
            os.environ.pop(lora_products.ENV, None)
        else:
            os.environ[lora_products.ENV] = before
    return digests


def timed_steps(runner: ModelRunner, work: str, reps: int, clock=time.perf_counter,
                prompts: bool = False, products: tuple[str, ...] = ()) -> dict[str, float]:
    """Median milliseconds per level, the levels interleaved step by step."""
    by_kind = {kind: load_adapters(runner, work, kind, 4 * i) for i, kind in enumerate(products or (None,))}
    pages = {j: tuple(runner.ledger.allocate(f"r{j}", "t", 4)) for j in range(16)}
    gen = torch.Generator().manual_seed(0)
    prompt_ids = [tuple(torch.randint(1000, 30000, (PROMPT_TOKENS,), generator=gen).tolist()) for _ in range(2)]

    def decode(adapters) -> float:
        plan = StepPlan(None, tuple(DecodeWork(f"r{j}", "t", 40, 500 + j, pages[j], a)
                                    for j, a in enumerate(adapters)), ())
        start = clock()
        runner.run(plan)
        return clock() - start

    def prefill(adapters) -> float:
        """One step of two whole prompts (one pass where the runner batches prompts); pages back after."""
        works = []
        try:
            for i, a in enumerate(adapters):
                held = tuple(runner.ledger.allocate(f"p{i}", "t", -(-PROMPT_TOKENS // runner.page_size)))
                works.append(PrefillWork(f"p{i}", "t", 0, prompt_ids[i], held, True, adapter=a))
            start = clock()
            runner.run(StepPlan(tuple(works), (), ()))
            return clock() - start
        finally:
            for w in works:
                runner.ledger.release(w.request_id)
            scrub_released(runner.pool, runner.ledger)

    levels = {"1 row": (decode, [None]), "16 rows": (decode, [None] * 16)}
    if prompts:
        levels["2 prompts"] = (prefill, [None, None])
    for kind, digests in by_kind.items():
        at = "" if kind is None else f" ({kind})"
        levels |= {f"1 row, adapter{at}": (decode, digests[:1]),
                   f"16 rows, 4 adapters{at}": (decode, [digests[j % 4] for j in range(16)])}
        if prompts:
            levels[f"2 prompts, 2 adapters{at}"] = (prefill, digests[:2])
    for fn, adapters in levels.values():
        fn(adapters)  # warm-up (and the adapters' packing for the C decode layers)
    times = {name: [] for name in levels}
    for _ in range(reps):
        for name, (fn, adapters) in levels.items():
            times[name].append(fn(adapters))
    return {name: statistics.median(t) * 1000 for name, t in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cpu-time", action="store_true", help="this thread's CPU time instead of wall time")
    p.add_argument("--glue", choices=("c", "torch"), action="append", help="decode glue to run (default both)")
    p.add_argument("--prompts", action="store_true", help="also a step of two 256-token prompts")
    p.add_argument("--products", default="", help="arithmetics to compare, e.g. int8,bf16 (default: this process's)")
    args = p.parse_args(argv)
    kinds = tuple(k for k in args.products.split(",") if k)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as work:
        for glue in args.glue or ("c", "torch"):
            runner = runner_for(glue)
            figures = timed_steps(runner, work, args.reps, time.thread_time if args.cpu_time else time.perf_counter,
                                  args.prompts, kinds)
            ratios = {}
            for at in [f" ({k})" for k in kinds] or [""]:
                ratios[f"1 row{at}"] = figures["1 row"] / figures[f"1 row, adapter{at}"]
                ratios[f"16 rows{at}"] = figures["16 rows"] / figures[f"16 rows, 4 adapters{at}"]
                if args.prompts:
                    ratios[f"2 prompts{at}"] = figures["2 prompts"] / figures[f"2 prompts, 2 adapters{at}"]
            print(f"decode glue {runner.model.decode_glue}: "
                  + ", ".join(f"{k} {v:.1f} ms" for k, v in figures.items())
                  + "; base/adapter step time " + ", ".join(f"{v:.2f} at {k}" for k, v in ratios.items()),
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
