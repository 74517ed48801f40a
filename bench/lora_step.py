"""One decode step under LoRA adapters, in process: where an adapter's time goes.

The bundled SmolLM2 on its default kernels, decode rows of 1 and 16
requests, on the C decode layers and through torch glue: the base model,
and the same rows under adapters of rank 16 on every linear layer (16 rows
over four adapters). The four levels are interleaved, one step of each in
turn, so that a noisy neighbour slows them alike. Medians of --reps steps,
milliseconds: wall time, or with --cpu-time this thread's CPU time (with
--threads 1 every kernel runs on this thread).

    .venv/bin/python -m bench.lora_step [--reps 9] [--threads 2] [--cpu-time] [--glue c]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.lora_adapters import write_adapter
from bulkhead.engine.admission import AdapterRef
from bulkhead.engine.runner import ModelRunner, RunnerConfig
from bulkhead.engine.step_plan import DecodeWork, StepPlan
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.ledger import PageLedger
from bulkhead.kv.pool import KVPool
from bulkhead.lora.peft_files import BaseShapes, read_adapter
from bulkhead.model.gguf_import import default_model_dir
from bulkhead.model.loader import load_model


def runner_for(glue: str) -> ModelRunner:
    model = load_model(default_model_dir(), linear_kernel="q4-i16in", head_kernel="q8-i16in",
                       decode_attention="c", decode_glue=glue)
    c = model.config
    layout = KVLayout(c.num_layers, c.num_kv_heads, c.head_dim, 16, "bfloat16")
    return ModelRunner(model, KVPool(layout, 256, "zero"), PageLedger(256), RunnerConfig(decode_row_multiple=2))


def timed_steps(runner: ModelRunner, work: tempfile.TemporaryDirectory, reps: int,
                clock=time.perf_counter) -> dict[str, float]:
    shapes = BaseShapes.of(runner.model.config)
    digests = []
    for i in range(4):
        path = write_adapter(Path(work) / f"a{i}", shapes, rank=16, alpha=32, seed=i, scale=0.02,
                             dtype=torch.bfloat16)
        digest = read_adapter(path, shapes).digest
        runner.adapters.acquire(AdapterRef(f"a{i}", str(path), digest))
        digests.append(digest)
    pages = {j: tuple(runner.ledger.allocate(f"r{j}", "t", 4)) for j in range(16)}

    def step(adapters) -> float:
        plan = StepPlan(None, tuple(DecodeWork(f"r{j}", "t", 40, 500 + j, pages[j], a)
                                    for j, a in enumerate(adapters)), ())
        start = clock()
        runner.run(plan)
        return clock() - start

    levels = {"1 row": [None], "1 row, adapter": digests[:1], "16 rows": [None] * 16,
              "16 rows, 4 adapters": [digests[j % 4] for j in range(16)]}
    for adapters in levels.values():
        step(adapters)  # warm-up (and the adapters' packing for the C decode layers)
    times = {name: [] for name in levels}
    for _ in range(reps):
        for name, adapters in levels.items():
            times[name].append(step(adapters))
    return {name: statistics.median(t) * 1000 for name, t in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cpu-time", action="store_true", help="this thread's CPU time instead of wall time")
    p.add_argument("--glue", choices=("c", "torch"), action="append", help="decode glue to run (default both)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as work:
        for glue in args.glue or ("c", "torch"):
            runner = runner_for(glue)
            figures = timed_steps(runner, work, args.reps, time.thread_time if args.cpu_time else time.perf_counter)
            ratios = (figures["1 row"] / figures["1 row, adapter"],
                      figures["16 rows"] / figures["16 rows, 4 adapters"])
            print(f"decode glue {runner.model.decode_glue}: "
                  + ", ".join(f"{k} {v:.1f} ms" for k, v in figures.items())
                  + f"; base/adapter step time {ratios[0]:.2f} at 1 row, {ratios[1]:.2f} at 16", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
