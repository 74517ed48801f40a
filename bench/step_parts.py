"""Where one request's decode step goes, part by part, in one thread's CPU time.

    python bench/step_parts.py --model /tmp/peers-ckpt/smollm2-q4_0.gguf
    python bench/step_parts.py --checkouts .,/tmp/base --rounds 4   # A/B: fresh processes, alternating

Builds the engine as a decode worker serves (guards on, the kernel table's
kernels, one torch thread), runs one greedy request's prompt, then times
--steps engine steps of its decode (Engine.step: schedule, run, sample,
emit) in this thread's CPU time, and inside each step the parts named
below by wrapping the functions that compute them (each wrapper reads the
thread clock twice, ~1 us). A part the checkout does not have (it runs
inside another) reads 0. Several checkouts run as fresh processes, one
after another, their order reversed every other round: two versions of the
package cannot share one process.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (part, owner path, attribute): the functions timed; the first found of each is wrapped.
PARTS = (
    ("runner.run (all)", "runner", "run"),
    ("model.forward (all)", "model", "forward"),
    ("guards: page ownership", "runner", "check_ownership"),
    ("batch build", "runner", "_build_batch"),
    ("embedding lookup", "embed", "__getitem__"),
    ("C layers", "c_layers", "run"),
    ("C layers + tail (one call)", "c_layers", "step"),
    ("final norm (Python)", "model", "_c_final_norm"),
    ("lm_head (Python)", "lm_head", "__call__"),
    ("sampler", "sampler", "sample"),
    ("schedule", "scheduler", "schedule"),
    ("complete (stops)", "scheduler", "complete"),
    ("emit (detokenize, sink)", "engine", "_emit_token"),
)


def wrap(owner, name: str, sink: list[float]) -> None:
    if name.startswith("__"):  # Python looks dunders up on the class: wrap them in a subclass of the owner's own
        fn, cls = getattr(type(owner), name), type(owner)
        owner.__class__ = type(cls.__name__ + "Timed", (cls,), {name: lambda *a, **k: timed(fn, sink, *a, **k)})
        return
    fn = getattr(owner, name)
    setattr(owner, name, lambda *a, **k: timed(fn, sink, *a, **k))


def timed(fn, sink: list[float], *a, **k):
    t = time.thread_time()
    try:
        return fn(*a, **k)
    finally:
        sink[0] += time.thread_time() - t


def child(args) -> None:
    sys.path.insert(0, str(Path.cwd()))
    import torch

    from bulkhead.engine.admission import Admitted
    from bulkhead.engine.builder import build_engine
    from bulkhead.engine.engine_config import EngineConfig
    from bulkhead.engine.request import SamplingParams
    from bulkhead.model.gguf_import import resolve_model

    torch.set_num_threads(1)
    built = build_engine(EngineConfig(model_dir=resolve_model(args.model), model_id="m", kv_memory_bytes=64 * 2**20,
                                      context_length=2048, threads=1), decode_only=False)
    engine = built.engine
    model = engine.runner.model
    owners = {"runner": engine.runner, "c_layers": getattr(model, "_c_layers", None), "model": model,
              "lm_head": model.weights.lm_head, "sampler": engine.sampler, "scheduler": engine.scheduler,
              "embed": None if isinstance(model.weights.embed, torch.Tensor) else model.weights.embed,  # a Q8Embedding
              "engine": engine}
    sinks = {part: [0.0] for part, _, _ in PARTS}
    for part, owner, name in PARTS:
        if owners[owner] is not None and hasattr(owners[owner], name):
            wrap(owners[owner], name, sinks[part])
    prompt = tuple(range(1000, 1000 + args.prompt_tokens))
    per_step: dict[str, list[float]] = defaultdict(list)
    for r in range(args.requests):
        got = []
        engine.submit(Admitted(f"r{r}", "t", prompt, SamplingParams(max_tokens=args.steps + 9, temperature=0.0,
                                                                     ignore_eos=True), 2048), got.append)
        engine._take_commands(block=False)
        while not got:
            engine.step()  # the prompt and its first token
        for _ in range(8):
            engine.step()  # warm-up
        for _ in range(args.steps):
            for s in sinks.values():
                s[0] = 0.0
            t = time.thread_time()
            engine.step()
            per_step["step (total)"].append(time.thread_time() - t)
            for part, s in sinks.items():
                per_step[part].append(s[0])
        engine.run_until_idle()
    for part, ts in per_step.items():
        print(f"PART {part}\t{statistics.median(ts) * 1e3:.3f}")
    import bulkhead
    print(f"TOKENS {got[-1].token_ids} from {bulkhead.__file__}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path("/tmp/peers-ckpt/smollm2-q4_0.gguf"),
                    help="a model directory or GGUF file")
    ap.add_argument("--checkouts", default=str(ROOT), help="comma list of repository directories to compare")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60, help="timed decode steps per request")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    checkouts = [Path(c).resolve() for c in args.checkouts.split(",") if c]
    table: dict[Path, dict[str, list[float]]] = {c: defaultdict(list) for c in checkouts}
    for r in range(args.rounds):
        for c in checkouts if r % 2 == 0 else checkouts[::-1]:
            run = subprocess.run([sys.executable, __file__, "--child", "--model", str(args.model), "--requests",
                                  str(args.requests), "--steps", str(args.steps), "--prompt-tokens",
                                  str(args.prompt_tokens)], cwd=c, capture_output=True, text=True)
            if run.returncode:
                print(run.stdout + run.stderr, file=sys.stderr)
                return run.returncode
            for line in run.stdout.splitlines():
                if line.startswith("PART "):
                    part, ms = line[5:].rsplit("\t", 1)
                    table[c][part].append(float(ms))
    print(f"median over {args.rounds} round(s) of each process's median step, ms of one thread's CPU time")
    parts = list(next(iter(table.values())))
    print(f"{'part':<26}" + "".join(f"{str(c)[-24:]:>26}" for c in checkouts))
    for part in parts:
        print(f"{part:<26}" + "".join(f"{statistics.median(table[c][part]):>26.3f}" for c in checkouts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
