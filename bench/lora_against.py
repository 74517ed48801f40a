"""One decode row's adapter cost, this tree's delta against another
checkout's, in one process: the bundled SmolLM2 on the C decode layers as
`bulkhead serve` builds them, one row on the base model, one under an
adapter of rank 16 on all seven linears packed as this tree packs it, and
one under the same kind of adapter packed and run by the other checkout's
bulkhead/model/lora_layers.py and csrc/lora_delta.c (loaded beside this
tree's; the C layers call whichever delta the step's StepDeltas names).
The three levels interleaved step by step; one thread's CPU time of the
whole step and of the C decode layers, median and 20th percentile (the
least disturbed on a shared machine), and the adapter's cost above the base
row's. Each side packs as its own default for this CPU.

    git worktree add /tmp/main main   # or any checkout of the commit to compare with
    .venv/bin/python -m bench.lora_against --against /tmp/main [--reps 300]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import tempfile
import time
from pathlib import Path

import torch

from bench import lora_step
from bulkhead.engine.step_plan import DecodeWork, StepPlan
from bulkhead.lora.peft_files import BaseShapes, read_adapter, read_weights
from bulkhead.model import decode_kernel, decode_layers, lora_layers
from bulkhead.model.lora_weights import LoraWeights


def other_delta(root: Path):
    """The other checkout's lora_layers module, its load() bound to its own lora_delta.c's library."""
    spec = importlib.util.spec_from_file_location("other_lora_layers", root / "bulkhead/model/lora_layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    source = root / "bulkhead/model/csrc/lora_delta.c"
    lib = ctypes.CDLL(str(decode_kernel._build(decode_kernel._compiler(),
                                               [*decode_kernel.FLAGS, "-fopenmp", "-ffp-contract=off"], source)))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.lora_layer_delta.restype = i64
    lib.lora_layer_delta.argtypes = [p, i64, i64, p, i64, i64, p, i64, ctypes.c_int]
    lib.lora_bf16_dots.restype = ctypes.c_int
    module.load = lambda: lib
    return module, lib


def packed_by(module, lib, work: Path, config):
    """The adapter at work/a4 packed as `module` packs it: its PackedAdapter took `pairs` before the int8
    packing, `products` since."""
    data = read_weights(work / "a4")
    fp32 = LoraWeights.load(read_adapter(work / "a4", BaseShapes.of(config), data=data), config, data)
    try:
        return module.PackedAdapter(fp32, products=module.products())
    except (TypeError, AttributeError):
        return module.PackedAdapter(fp32, pairs=bool(lib.lora_bf16_dots()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", type=Path, required=True, help="the other checkout's root")
    p.add_argument("--reps", type=int, default=300)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    other, lib = other_delta(args.against)
    runner = lora_step.runner_for("c")
    layers_time, run = [], runner.model._c_layers.run

    def timed(x, batch, kv):
        start = time.thread_time()
        out = run(x, batch, kv)
        layers_time.append(time.thread_time() - start)
        return out

    runner.model._c_layers.run = timed
    with tempfile.TemporaryDirectory() as work:
        ours = lora_step.load_adapters(runner, work, None, 0)[0]
        theirs = lora_step.load_adapters(runner, work, None, 4)[0]
        runner.adapters.get(theirs).packed[0] = packed_by(other, lib, Path(work), runner.model.config)
        pages = tuple(runner.ledger.allocate("r0", "t", 4))
        levels = {"base": (None, lora_layers), "this tree": (ours, lora_layers), str(args.against): (theirs, other)}
        step = {k: [] for k in levels}
        layers = {k: [] for k in levels}
        try:
            for rep in range(args.reps + 3):  # 3 warm-up rounds
                for name, (digest, module) in levels.items():
                    decode_layers.lora_layers = module
                    plan = StepPlan(None, (DecodeWork("r0", "t", 40, 500, pages, digest),), ())
                    layers_time.clear()
                    start = time.thread_time()
                    runner.run(plan)
                    if rep >= 3:
                        step[name].append(time.thread_time() - start)
                        layers[name].append(layers_time[0])
        finally:
            decode_layers.lora_layers = lora_layers

    def at(values, f):
        return sorted(values)[int(f * (len(values) - 1))] * 1000

    print(f"one decode row, one thread's CPU time, {args.reps} steps a level, interleaved (ms):")
    for name in levels:
        cost = {f: at(layers[name], f) - at(layers["base"], f) for f in (0.5, 0.2)}
        print(f"  {name}: step {at(step[name], .5):.3f} (base/this {at(step['base'], .5) / at(step[name], .5):.3f}); "
              f"C layers {at(layers[name], .5):.3f}, adapter +{cost[0.5]:.3f} median, +{cost[0.2]:.3f} at p20")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
