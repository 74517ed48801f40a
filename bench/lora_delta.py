"""The LoRA delta alone (csrc/lora_delta.c's lora_layer_delta), in process:
this tree's build, with bf16 products (where the CPU has them) and with fp32
ones, against the same file at another git commit, interleaved.

Four adapters of rank 16 on all seven linears (bench/lora_adapters.py, bf16,
SmolLM2-135M's shapes), packed as the C decode layers pack them, and the
delta of every linear of one layer on: a decode step's 16 rows over the
four adapters, and a prompt pass's 2 x 256 rows under two adapters. Each
case runs `--calls` times per rep on each library in turn; medians of
--reps, this thread's CPU time with --threads 1 (one OpenMP thread), per
layer, so x 30 for a pass of SmolLM2. Also the delta's multiply-adds per
second.

    .venv/bin/python -m bench.lora_delta --against HEAD [--reps 7] [--threads 1]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from bench.lora_adapters import write_adapter
from bulkhead.lora.peft_files import BaseShapes, read_adapter, read_weights
from bulkhead.model import decode_kernel, lora_kernel, lora_layers
from bulkhead.model.config import load_model_config
from bulkhead.model.gguf_import import default_model_dir
from bulkhead.model.lora_rows import LoraRows
from bulkhead.model.lora_weights import LoraWeights

CASES = {"decode, 16 rows over 4 adapters": [j % 4 for j in range(16)],
         "prompts, 2 x 256 rows over 2 adapters": [0] * 256 + [1] * 256}


def library_at(commit: str, work: Path) -> ctypes.CDLL:
    """lora_delta.c as it was at `commit`, built with this tree's flags."""
    rel = lora_kernel.SOURCE.relative_to(Path(__file__).resolve().parent.parent)
    text = subprocess.run(["git", "show", f"{commit}:{rel}"], capture_output=True, text=True, check=True).stdout
    source = work / "csrc" / "lora_delta.c"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(text)
    for header in lora_kernel.SOURCE.parent.glob("*.h"):
        (source.parent / header.name).write_text(header.read_text())
    lib = ctypes.CDLL(str(decode_kernel._build(decode_kernel._compiler(), [*decode_kernel.FLAGS, "-fopenmp",
                                                                            "-ffp-contract=off"], source)))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.lora_layer_delta.restype = i64
    lib.lora_layer_delta.argtypes = [p, i64, i64, p, i64, i64, p, i64, ctypes.c_int]
    return lib


def adapters(work: Path, config, pairs: bool) -> list[LoraWeights]:
    """The four adapters, packed for bf16 products (`pairs`) or fp32 ones."""
    shapes, out = BaseShapes.of(config), []
    for i in range(4):
        path = write_adapter(work / f"a{i}", shapes, rank=16, alpha=32, seed=i, scale=0.02, dtype=torch.bfloat16)
        data = read_weights(path)
        weights = LoraWeights.load(read_adapter(path, shapes, data=data), config, data)
        weights.packed.append(lora_layers.PackedAdapter(weights, pairs=pairs))
        out.append(weights)
    return out


def macs(weights: LoraWeights, rows: list[int]) -> int:
    """The multiply-adds of one layer's deltas over these rows."""
    fused = weights.layers[0].values()
    per_row = sum(d.a.numel() + sum(p.b.numel() for p in d.parts) for d in fused)
    return per_row * len(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", default="HEAD", help="git commit whose lora_delta.c to compare with")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = load_model_config(default_model_dir())
    with tempfile.TemporaryDirectory() as tmp:
        here = lora_layers.load()
        libs = {args.against: (library_at(args.against, Path(tmp)), False), "fp32": (here, False)}
        if here.lora_bf16_dots():
            libs["bf16"] = (here, True)
        weights = {pairs: adapters(Path(tmp), config, pairs) for pairs in (False, True)}
        widths = {"qkv": (config.hidden_size, config.q_size + 2 * config.kv_size),
                  "o": (config.q_size, config.hidden_size),
                  "gate_up": (config.hidden_size, 2 * config.intermediate_size),
                  "down": (config.intermediate_size, config.hidden_size)}
        times = {(case, lib): [] for case in CASES for lib in libs}
        for _ in range(args.reps):
            for case, which in CASES.items():
                xs = {n: torch.randn(len(which), w[0]) for n, w in widths.items()}
                for name, (lib, pairs) in libs.items():
                    deltas = lora_layers.StepDeltas(lib, LoraRows.of([weights[pairs][a] for a in which]))
                    ys = {n: torch.zeros(len(which), w[1]) for n, w in widths.items()}
                    start = time.thread_time()
                    for _ in range(args.calls):
                        for linear in lora_layers.LINEARS:
                            deltas.add(0, linear, xs[linear], ys[linear])
                    times[(case, name)].append((time.thread_time() - start) / args.calls)
    print(f"one layer's deltas, {args.threads} thread(s), CPU time, median of {args.reps}:")
    for case, which in CASES.items():
        base = statistics.median(times[(case, args.against)])
        for name in libs:
            t = statistics.median(times[(case, name)])
            print(f"  {case}: {name:<10} {t * 1000:7.3f} ms  {macs(weights[False][0], which) / t / 1e9:5.1f} GMAC/s"
                  f"  ({base / t:.2f}x {args.against})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
