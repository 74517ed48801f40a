"""Noisy neighbour in process, on a clock of one thread's CPU time.

    python bench/noisy_clock.py                       # issue 14's flood, 10 light requests per variant
    python bench/noisy_clock.py --heavy-streams 8 --heavy-prompt-tokens 600 --light-requests 6   # quick

bench/noisy_neighbour.py measures the served system in wall time; on a
machine that others load it measures mostly them. This drives one engine,
built as `bulkhead serve --role colocated` builds it, on the calling thread
(`--threads 1`), and keeps a virtual clock that advances by the engine
thread's CPU time per step: what the steps cost, not how long the machine
kept them waiting. Every request arrives between steps; one that arrives
during a step (its virtual time falls inside it) is taken when the step
ends, as the engine takes commands, and its time to first token runs from
its arrival to the CPU time at which its first token was emitted.

The flood: --heavy-streams closed-loop streams of the heavy tenant's long
prompts (a stream sends its next prompt when one ends). Once every stream
has had its first token, the light tenant sends its requests one after
another, each arriving a random time (0 .. --max-gap seconds, seeded) after
the last one ended. Variants run on the same flood, request by request in
turn, so they see the same heavy state: `latency-budget` (the scheduler as
it is), `slice-128` (as it is with the parent's 128-token slices of a long
pass, not SchedulerConfig.slice_tokens' 64), `whole-batch` (every decode row in one step, as
before decode_rounds.py) and `shared-step` (whole batches and
ChunkPlanner.first_tokens_first off: a light prompt shares its step with
the flood's decode rows, as before it).
Alone: the light requests on an idle engine. Prints, per variant, the
light median and p99 time to first token alone and flooded with their
ratios, and the heavy tenant's output tokens per CPU second while each
variant's requests ran.
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

from bench.workload import percentile  # noqa: E402
from bulkhead.engine.admission import admit  # noqa: E402
from bulkhead.engine.builder import EngineConfig, build_engine  # noqa: E402
from bulkhead.engine.pass_slices import layers_per_slice  # noqa: E402
from bulkhead.engine.request import SamplingParams  # noqa: E402
from bulkhead.model.gguf_import import default_model_dir  # noqa: E402

FIRST_ID, LAST_ID = 1000, 30000  # ordinary tokens of the bundled SmolLM2 (as bench/prompt_step.py)
VARIANTS = ("latency-budget", "slice-128", "whole-batch", "shared-step")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heavy-streams", type=int, default=24)
    ap.add_argument("--heavy-prompt-tokens", type=int, default=1600)
    ap.add_argument("--heavy-output-tokens", type=int, default=200)
    ap.add_argument("--light-requests", type=int, default=10, help="per variant")
    ap.add_argument("--light-prompt-tokens", type=int, default=80)
    ap.add_argument("--light-output-tokens", type=int, default=4, help="only its first token is timed")
    ap.add_argument("--max-gap", type=float, default=0.25, help="seconds between a light request and the next")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kv-memory-gib", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default="latency-budget,whole-batch", help=f"comma list of {', '.join(VARIANTS)}")
    return ap


class Clock:
    """Virtual seconds: the engine thread's CPU time inside steps only."""

    def __init__(self, engine):
        self.engine, self.now, self._step_start = engine, 0.0, None

    def step(self) -> None:
        self._step_start = time.thread_time()
        try:
            self.engine.run_once()
        finally:
            self.now += time.thread_time() - self._step_start
            self._step_start = None

    def read(self) -> float:
        """The virtual time now (inside a step: how far into it)."""
        inside = time.thread_time() - self._step_start if self._step_start is not None else 0.0
        return self.now + inside


class Flood:
    """The flood and the light tenant over a harness's step(), time() (its
    virtual clock between steps), idle() and submit(): one engine here
    (Bench), both workers' engines by turns in bench/noisy_turns.py."""

    def run_until(self, done, streams: list[str], limit: int = 200_000) -> None:
        """Steps until done(); a heavy stream whose request ended sends its next."""
        for _ in range(limit):
            if done():
                return
            for i, rid in enumerate(streams):
                if rid in self.done:
                    streams[i] = self.submit("heavy", self.args.heavy_prompt_tokens, self.args.heavy_output_tokens)
            self.step()
        raise RuntimeError("the engines never got there")

    def light(self, streams: list[str]) -> tuple[float, float]:
        """One light request arriving a random gap from now, taken when the
        step in progress ends: (ttft, cpu seconds it took)."""
        arrival = self.time() + self.rng.uniform(0.0, self.args.max_gap)
        self.run_until(lambda: self.time() >= arrival or self.idle(), streams)
        arrival = min(arrival, self.time())  # an idle engine takes it at once
        rid = self.submit("light", self.args.light_prompt_tokens, self.args.light_output_tokens)
        self.run_until(lambda: rid in self.done, streams)
        return self.first[rid] - arrival, self.time() - arrival


class Bench(Flood):
    def __init__(self, args, rng: random.Random):
        self.args, self.rng = args, rng
        self.built = build_engine(EngineConfig(model_dir=default_model_dir(), model_id="bench",
                                               kv_memory_bytes=int(args.kv_memory_gib * 2**30),
                                               clamp_context_length=True))
        self.engine = self.built.engine
        self.clock = Clock(self.engine)
        self.vocab = self.engine.runner.model.config.vocab_size
        self.first: dict[str, float] = {}  # request id -> virtual time of its first token
        self.done: set[str] = set()
        self.heavy_tokens = 0
        self._ids = iter(range(10**9))

    def prompt(self, n: int) -> list[int]:  # fresh ids every time: no prefix-cache hit
        return [self.rng.randrange(FIRST_ID, min(self.vocab, LAST_ID)) for _ in range(n)]

    def submit(self, tenant: str, tokens: int, max_tokens: int) -> str:
        rid = f"{tenant}-{next(self._ids)}"
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        self.engine.submit(admit(rid, tenant, self.prompt(tokens), params, self.built.limits), self._sink(rid))
        return rid

    def _sink(self, rid: str):
        def sink(out) -> None:
            if out.token_ids and rid not in self.first:
                self.first[rid] = self.clock.read()
            if rid.startswith("heavy"):
                self.heavy_tokens += len(out.token_ids)
            if out.finished:
                self.done.add(rid)
        return sink

    def step(self) -> None:
        self.clock.step()

    def time(self) -> float:
        return self.clock.now

    def idle(self) -> bool:
        return not self.engine.has_pending()


def slice_budget(scheduler, tokens: int) -> None:
    """Slices of tokens' worth of a pass from the next one on, the pass in flight's too."""
    scheduler.planner.slice_tokens = tokens
    flying = scheduler.in_flight
    if flying is not None:
        flying.per_slice = layers_per_slice(flying.num_layers, len(flying.work.token_ids), tokens)


def set_variant(engine, name: str) -> None:
    """Put the scheduler as the variant has it; every variant undoes the others first."""
    planner = engine.scheduler.planner
    planner.__dict__.pop("first_tokens_first", None)
    slice_budget(engine.scheduler, 128 if name == "slice-128" else engine.scheduler.config.slice_tokens)
    planner.rounds.budget = engine.scheduler.config.decode_step_tokens
    if name in ("whole-batch", "shared-step"):  # before decode rounds: every decode row in one step
        planner.rounds.budget = 0
    if name == "shared-step":  # the scheduler before first tokens first
        planner.first_tokens_first = lambda prefills, decode: False


def summary(ttfts: list[float]) -> tuple[float, float]:
    return statistics.median(ttfts), percentile(ttfts, 99)


def interleaved(b: Flood, args, variants: list[str], choose) -> tuple[dict, dict, dict, float]:
    """Each light request under every variant in turn (choose(v) switches to v), first alone, then under
    the flood: (alone's and flooded's TTFTs per variant, heavy [tokens, CPU seconds] per variant, the
    flood's ramp on b's clock)."""
    b.light([])  # warm-up: first-call allocations and kernel builds
    alone = {v: [] for v in variants}
    for _ in range(args.light_requests):
        for v in variants:
            choose(v)
            alone[v].append(b.light([])[0])
    streams = [b.submit("heavy", args.heavy_prompt_tokens, args.heavy_output_tokens) for _ in range(args.heavy_streams)]
    b.run_until(lambda: all(r in b.first for r in streams), streams)
    ramp = b.time()
    flooded = {v: [] for v in variants}
    heavy = {v: [0, 0.0] for v in variants}  # tokens, CPU seconds
    for _ in range(args.light_requests):
        for v in variants:
            choose(v)
            before = b.heavy_tokens
            ttft, took = b.light(streams)
            flooded[v].append(ttft)
            heavy[v][0] += b.heavy_tokens - before
            heavy[v][1] += took
    return alone, flooded, heavy, ramp


def report(args, how: str, variants: list[str], alone: dict, flooded: dict, heavy: dict, ramp: float) -> None:
    print(f"threads {torch.get_num_threads()}, CPU-time clock{how}; flood: {args.heavy_streams} x "
          f"{args.heavy_prompt_tokens}-token prompts, {args.heavy_output_tokens} out (ramp {ramp:.1f} s); "
          f"light: {args.light_requests} x {args.light_prompt_tokens} tokens per variant, interleaved")
    print(f"{'variant':<20} {'alone med/p99 (s)':>18} {'flooded med/p99 (s)':>20} {'median x':>9} {'p99 x':>6} "
          f"{'heavy tok/cpu-s':>15}")
    for v in variants:
        (am, ap), (fm, fp) = summary(alone[v]), summary(flooded[v])
        print(f"{v:<20} {am:8.3f} / {ap:6.3f} {fm:10.3f} / {fp:6.3f} {fm / am:8.2f}x {fp / ap:5.2f}x "
              f"{heavy[v][0] / heavy[v][1]:15.1f}")


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    variants = args.variants.split(",")
    if not set(variants) <= set(VARIANTS):
        parser().error(f"--variants: one of {', '.join(VARIANTS)}")
    torch.set_num_threads(args.threads)
    b = Bench(args, random.Random(args.seed))
    measured = interleaved(b, args, variants, lambda v: set_variant(b.engine, v))
    b.engine.check_integrity()
    report(args, "", variants, *measured)
    return 0


if __name__ == "__main__":
    sys.exit(main())
