"""The LoRA delta alone (csrc/lora_delta.c's lora_layer_delta), in process:
each arithmetic this CPU has (bulkhead.lora.products: int8 weights, bf16
products, fp32 products), interleaved.

Four adapters of rank 16 on all seven linears (bench/lora_adapters.py, bf16,
SmolLM2-135M's shapes), packed as the C decode layers pack them, and the
delta of every linear of one layer on: a decode step's one row, its 16
rows over the four adapters, and a prompt pass's 2 x 256 rows under two
adapters. Each case runs `--calls` times per rep in each arithmetic in
turn; medians of --reps, this thread's CPU time with --threads 1 (one
OpenMP thread), per layer, so x 30 for a pass of SmolLM2. Also the
delta's multiply-adds per second, and the bytes of weights it reads.

One layer's weights stay in cache across the calls, so the one-row case
here is the delta's arithmetic and call overhead, not its reads from
memory, which bench/lora_step.py's decode steps pay (30 layers' weights do
not stay in cache beside the base model's).

    .venv/bin/python -m bench.lora_delta [--reps 7] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.lora_adapters import write_adapter
from bulkhead.lora.peft_files import BaseShapes, read_adapter, read_weights
from bulkhead.model import lora_layers
from bulkhead.model.config import load_model_config
from bulkhead.model.gguf_import import default_model_dir
from bulkhead.model.lora_rows import LoraRows
from bulkhead.model.lora_weights import LoraWeights

CASES = {"decode, 1 row on 1 adapter": [0],
         "decode, 16 rows over 4 adapters": [j % 4 for j in range(16)],
         "prompts, 2 x 256 rows over 2 adapters": [0] * 256 + [1] * 256}


def adapters(work: Path, config, products: str) -> list[LoraWeights]:
    """The four adapters, packed for `products`."""
    shapes, out = BaseShapes.of(config), []
    for i in range(4):
        path = write_adapter(work / f"a{i}", shapes, rank=16, alpha=32, seed=i, scale=0.02, dtype=torch.bfloat16)
        data = read_weights(path)
        weights = LoraWeights.load(read_adapter(path, shapes, data=data), config, data)
        weights.packed.append(lora_layers.PackedAdapter(weights, products))
        out.append(weights)
    return out


def macs(weights: LoraWeights, rows: list[int]) -> int:
    """The multiply-adds of one layer's deltas over these rows."""
    fused = weights.layers[0].values()
    per_row = sum(d.a.numel() + sum(p.b.numel() for p in d.parts) for d in fused)
    return per_row * len(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = load_model_config(default_model_dir())
    with tempfile.TemporaryDirectory() as tmp:
        lib = lora_layers.load()
        kinds = ["fp32"] + (["bf16"] if lib.lora_bf16_dots() else []) + (["int8"] if lib.lora_int8() else [])
        weights = {kind: adapters(Path(tmp), config, kind) for kind in kinds}
        widths = {"qkv": (config.hidden_size, config.q_size + 2 * config.kv_size),
                  "o": (config.q_size, config.hidden_size),
                  "gate_up": (config.hidden_size, 2 * config.intermediate_size),
                  "down": (config.intermediate_size, config.hidden_size)}
        times = {(case, kind): [] for case in CASES for kind in kinds}
        for _ in range(args.reps):
            for case, which in CASES.items():
                xs = {n: torch.randn(len(which), w[0]) for n, w in widths.items()}
                for kind in kinds:
                    deltas = lora_layers.StepDeltas(lib, LoraRows.of([weights[kind][a] for a in which]))
                    ys = {n: torch.zeros(len(which), w[1]) for n, w in widths.items()}
                    start = time.thread_time()
                    for _ in range(args.calls):
                        for linear in lora_layers.LINEARS:
                            deltas.add(0, linear, xs[linear], ys[linear])
                    times[(case, kind)].append((time.thread_time() - start) / args.calls)
    print(f"one layer's deltas, {args.threads} thread(s), CPU time, median of {args.reps}:")
    for case, which in CASES.items():
        base = statistics.median(times[(case, kinds[0])])
        for kind in kinds:
            t = statistics.median(times[(case, kind)])
            held = weights[kind][0].packed[0].nbytes / len(weights[kind][0].layers)
            print(f"  {case}: {kind:<5} {t * 1000:7.3f} ms  {macs(weights['fp32'][0], which) / t / 1e9:5.1f} GMAC/s"
                  f"  ({base / t:.2f}x {kinds[0]}), {held / 1e3:.0f} kB of weights a layer an adapter")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
