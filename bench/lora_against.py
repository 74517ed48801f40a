"""An adapter's decode cost, this tree's delta against other checkouts', in
one process: the bundled SmolLM2 on the C decode layers as `bulkhead
serve` builds them, --rows decode rows (1, or 16 over four adapters) on
the base model, under adapters of rank 16 on all seven linears packed as
this tree packs them, and under the same kind of adapters packed and run by
each other checkout's bulkhead/model/lora_layers.py and csrc/lora_delta.c
(loaded beside this tree's; the C layers call whichever delta the step's
StepDeltas names). The levels interleaved step by step; one thread's CPU
time of the whole step and of the C decode layers (with the lm_head where
decode_step runs it there), median and 20th percentile (the least
disturbed on a shared machine), and the adapter's cost above the base
row's. Each side packs as its own default for this CPU.

    git worktree add /tmp/main main   # or any checkout of the commit to compare with
    .venv/bin/python -m bench.lora_against --against /tmp/main [--against OTHER] [--reps 300] [--rows 16]
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


def other_delta(root: Path, index: int = 0):
    """The other checkout's lora_layers module, its load() bound to its own lora_delta.c's library."""
    spec = importlib.util.spec_from_file_location(f"other_lora_layers_{index}", root / "bulkhead/model/lora_layers.py")
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


def packed_by(module, lib, path: Path, config):
    """The adapter at `path` packed as `module` packs it: its PackedAdapter took `pairs` before the int8
    packing, `products` since."""
    data = read_weights(path)
    fp32 = LoraWeights.load(read_adapter(path, BaseShapes.of(config), data=data), config, data)
    try:
        return module.PackedAdapter(fp32, products=module.products())
    except (TypeError, AttributeError):
        return module.PackedAdapter(fp32, pairs=bool(lib.lora_bf16_dots()))


def timed_c_layers(runner) -> list[float]:
    """The thread CPU time of each call into the C decode layers (decode_step, the layers and the lm_head,
    where it binds), appended to the list returned."""
    c_layers = runner.model._c_layers
    name = "step" if c_layers.runs_head else "run"
    layers_time, run = [], getattr(c_layers, name)

    def timed(x, batch, kv):
        start = time.thread_time()
        out = run(x, batch, kv)
        layers_time.append(time.thread_time() - start)
        return out

    setattr(c_layers, name, timed)
    return layers_time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", type=Path, action="append", required=True, help="another checkout's root")
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--rows", type=int, default=1, help="decode rows a step, over up to four adapters")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    others = [other_delta(root, i) for i, root in enumerate(args.against)]
    runner = lora_step.runner_for("c")
    layers_time = timed_c_layers(runner)
    with tempfile.TemporaryDirectory() as work:
        levels = {"base": ([None] * args.rows, lora_layers),
                  "this tree": (lora_step.load_adapters(runner, work, None, 0), lora_layers)}
        for i, (root, (module, lib)) in enumerate(zip(args.against, others)):
            digests = lora_step.load_adapters(runner, work, None, 4 * (i + 1))
            for j, digest in enumerate(digests):
                packed = packed_by(module, lib, Path(work) / f"a{4 * (i + 1) + j}", runner.model.config)
                runner.adapters.get(digest).packed[0] = packed
            levels[str(root)] = (digests, module)
        pages = {j: tuple(runner.ledger.allocate(f"r{j}", "t", 4)) for j in range(args.rows)}
        step = {k: [] for k in levels}
        layers = {k: [] for k in levels}
        try:
            for rep in range(args.reps + 3):  # 3 warm-up rounds
                for name, (digests, module) in levels.items():
                    decode_layers.lora_layers = module
                    plan = StepPlan(None, tuple(DecodeWork(f"r{j}", "t", 40, 500 + j, pages[j], digests[j % 4])
                                                for j in range(args.rows)), ())
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

    print(f"{args.rows} decode row(s), one thread's CPU time, {args.reps} steps a level, interleaved (ms):")
    for name in levels:
        cost = {f: at(layers[name], f) - at(layers["base"], f) for f in (0.5, 0.2)}
        print(f"  {name}: step {at(step[name], .5):.3f} (base/this {at(step['base'], .5) / at(step[name], .5):.3f}); "
              f"C layers {at(layers[name], .5):.3f}, adapter +{cost[0.5]:.3f} median, +{cost[0.2]:.3f} at p20")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
