"""What the page-lineage log costs: the engine serving 16 concurrent requests
with and without it, interleaved run by run in one process.

    python bench/lineage_overhead.py                    # 16 requests, 256 in / 64 out, 3 pairs
    python bench/lineage_overhead.py --requests 16 --reps 5 --out-tokens 128

One engine over the bundled model, driven on this thread as `serve` drives
it; between runs only its lineage sink changes (the ledger's, the pool's and
the engine's: the no-op sink, or a LineageLog writing to a temporary file
with its writer thread). Prints output tokens/s per run and the median
ratio with/without; on a shared machine only such interleaved A/B figures
mean anything (docs/performance.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bulkhead.engine.admission import admit  # noqa: E402
from bulkhead.engine.builder import EngineConfig, build_engine  # noqa: E402
from bulkhead.engine.request import SamplingParams  # noqa: E402
from bulkhead.lineage.sink import NULL_SINK  # noqa: E402
from bulkhead.lineage.verify import verify  # noqa: E402
from bulkhead.lineage.writer import LineageLog  # noqa: E402
from bulkhead.model.gguf_import import DEFAULT_MODEL_ID, default_model_dir  # noqa: E402


def use(built, sink) -> None:
    engine = built.engine
    engine.ledger.lineage = engine.pool.lineage = engine.lineage = sink


def one_run(built, n: int, prompt_tokens: int, out_tokens: int, tag: str) -> tuple[float, float]:
    """(output tokens per wall second, process CPU seconds per output token)."""
    g = torch.Generator().manual_seed(0)
    done = []
    for i in range(n):
        prompt = torch.randint(3, 49000, (prompt_tokens,), generator=g).tolist()
        params = SamplingParams(max_tokens=out_tokens, temperature=0.0, ignore_eos=True)
        built.engine.submit(admit(f"{tag}-{i}", f"t{i % 8}", prompt, params, built.limits), done.append)
    start, cpu = time.perf_counter(), time.process_time()
    built.engine.run_until_idle()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    produced = sum(len(o.token_ids) for o in done)
    assert produced == n * out_tokens, f"{produced} tokens, expected {n * out_tokens}"
    return produced / elapsed, cpu / produced


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--out-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3, help="pairs of runs (off, on), interleaved")
    args = p.parse_args()
    built = build_engine(EngineConfig(default_model_dir(), DEFAULT_MODEL_ID, kv_memory_bytes=512 * 2**20))
    one_run(built, 2, 32, 4, "warm")
    key = bytes(range(32))
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        log = LineageLog(Path(tmp) / "lineage.jsonl", key, process="bench")
        for rep in range(args.reps):
            for variant in ("off", "on"):
                use(built, log if variant == "on" else NULL_SINK)
                rate, cpu_per_token = one_run(built, args.requests, args.prompt_tokens, args.out_tokens,
                                              f"{variant}{rep}")
                rates[variant].append(rate)
                cpu[variant].append(cpu_per_token)
                print(f"rep {rep} lineage {variant:3s}: {rate:7.1f} output tok/s, {cpu_per_token * 1e3:7.2f} "
                      f"CPU ms per output token", flush=True)
        log.close()
        records = log.records_written
        # The hot path's share: one event's cost (measured here) times the events the runs recorded.
        probe = LineageLog(Path(tmp) / "probe.jsonl", key, flush_interval_s=3600)
        t = time.perf_counter()
        for i in range(20000):
            probe.allocated("r", "t", [i], [1])
        emit_s = (time.perf_counter() - t) / 20000
        probe.close()
        report = verify(log.path, key)
        print(f"log: {report.records} records, {log.path.stat().st_size} bytes, verify exit {report.exit_code}")
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(f"median output tok/s at {args.requests} requests: off {off:.1f}, on {on:.1f}; "
          f"with/without {on / off:.3f} ({(on / off - 1) * 100:+.1f}%)")
    best_off, best_on = max(rates["off"]), max(rates["on"])
    print(f"best output tok/s (the least disturbed run of each): off {best_off:.1f}, on {best_on:.1f}; "
          f"with/without {best_on / best_off:.3f} ({(best_on / best_off - 1) * 100:+.1f}%)")
    c_off, c_on = statistics.median(cpu["off"]), statistics.median(cpu["on"])
    print(f"median CPU per output token: off {c_off * 1e3:.2f} ms, on {c_on * 1e3:.2f} ms; "
          f"with/without {c_on / c_off:.3f}")
    engine_cpu = sum(cpu["on"]) * args.requests * args.out_tokens
    own = log.writer_cpu_s + emit_s * records
    print(f"the log's own CPU: writer thread {log.writer_cpu_s * 1e3:.1f} ms + {records} events x "
          f"{emit_s * 1e6:.2f} us on the engine thread = {own * 1e3:.1f} ms, "
          f"{own / engine_cpu * 100:.3f}% of the logged runs' {engine_cpu:.1f} CPU s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
