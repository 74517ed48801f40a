"""KV transfer bandwidth: each backend beside a plain in-process tensor copy, same run.

    python bench/transfer.py                      # shm, tcp, mooncake (mooncake re-runs itself under unshare -n)
    python bench/transfer.py --backends shm tcp --reps 3

One request's KV: 4,096 tokens of SmolLM2-135M (30 layers, 3 kv heads,
head_dim 64, fp32, page size 16) = 256 pages, ~189 MB. Decode runs in a
spawned process with its own pool; prefill (this process) moves the pages.
Page patterns: "fresh" (both sides hand out consecutive pages, as a fresh
allocator does), "scattered" (random pages on both sides, as after churn)
and "src-scattered" (prefill's pages scattered, decode's consecutive).
Every row is timed in turn with its peers, rep after rep: the plain copy
`dst[idx] = src[idx]` of the same pages within one process and,
for mooncake, Mooncake's own raw transfer_sync_write of the same number of
contiguous bytes. On this shared machine only such ratios mean anything.
Raw results go to bench/results/transfer-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bulkhead.disagg.transfer import BACKENDS, make_source, make_target  # noqa: E402
from bulkhead.kv.layout import KVLayout  # noqa: E402
from bulkhead.kv.pool import KVPool  # noqa: E402

LAYOUT = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, page_size=16, dtype="float32")
REQUEST_PAGES = 4096 // LAYOUT.page_size  # 256
POOL_PAGES = 320  # room for scattered pages on both sides
VARIANTS = {"shm": [{}], "tcp": [{}], "mooncake": [{}]}


def serve_decode(backend: str, conn) -> None:
    target = make_target(backend, LAYOUT, POOL_PAGES)
    conn.send(target.descriptor())
    conn.recv()  # "close"
    target.close()


def patterns() -> dict[str, tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(0)
    pick = lambda: torch.randperm(POOL_PAGES, generator=g)[:REQUEST_PAGES].tolist()  # noqa: E731
    fresh = list(range(10, 10 + REQUEST_PAGES))
    return {"fresh": (list(range(REQUEST_PAGES)), fresh), "scattered": (pick(), pick()), "src-scattered": (pick(), fresh)}


def timed(fns: dict, reps: int) -> dict[str, float]:
    """Median seconds of each fn, run in turn rep after rep, so that a noisy
    neighbour slows the measured path and its baseline alike."""
    for fn in fns.values():
        fn()  # warm-up: page faults, connections, registrations
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def plain_copy(src: KVPool, src_pages, dst_pages):
    """The peer every row is measured against: the same pages copied within one process."""
    dst = torch.zeros_like(src.data)
    s, d = torch.tensor(src_pages), torch.tensor(dst_pages)

    def run():
        dst[d] = src.data[s]

    return run


def mooncake_raw(descriptor: dict, nbytes: int):
    """Mooncake's own transfer_sync_write of nbytes contiguous bytes into decode's pool."""
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = torch.ones(nbytes, dtype=torch.uint8)
    assert engine.register_memory(buf.data_ptr(), nbytes) == 0

    def run():
        assert engine.transfer_sync_write(descriptor["session"], buf.data_ptr(), descriptor["base"], nbytes) == 0

    run.keep = (engine, buf)  # alive as long as the closure
    return run


def bench_backend(backend: str, src: KVPool, pats, nbytes: int, reps: int) -> list[dict]:
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=serve_decode, args=(backend, child), daemon=True)
    proc.start()
    rows = []
    try:
        descriptor = conn.recv()
        raw = mooncake_raw(descriptor, nbytes) if backend == "mooncake" else None
        for opts in VARIANTS[backend]:
            source = make_source(backend, **opts)
            for pattern, (sp, dp) in pats.items():
                gens = [1] * len(dp)
                fns = {"write": lambda: source.write_pages(descriptor, "bench", src, sp, dp, gens),
                       "copy": plain_copy(src, sp, dp)}
                if raw is not None:
                    fns["raw"] = raw
                t = timed(fns, reps)
                label = backend + ("" if not opts else "-" + ",".join(f"{k}={v}" for k, v in opts.items()))
                rows.append({"backend": label, "pattern": pattern, "seconds": t["write"], "copy_seconds": t["copy"],
                             "mooncake_raw_seconds": t.get("raw"), "source_stats": source.stats()})
            source.close()
    finally:
        conn.send("close")
        proc.join(30)
    return rows


def run(backends: list[str], reps: int) -> list[dict]:
    src = KVPool(LAYOUT, POOL_PAGES)
    src.data.normal_()
    pats = patterns()
    nbytes = REQUEST_PAGES * LAYOUT.bytes_per_page
    rows = []
    for backend in backends:
        rows += bench_backend(backend, src, pats, nbytes, reps)
    for r in rows:
        r["bytes"], r["gb_per_s"] = nbytes, nbytes / r["seconds"] / 1e9
        r["copy_gb_per_s"] = nbytes / r["copy_seconds"] / 1e9
        r["x_copy"] = r["copy_seconds"] / r["seconds"]
        if r["mooncake_raw_seconds"]:
            r["mooncake_raw_gb_per_s"] = nbytes / r["mooncake_raw_seconds"] / 1e9
            r["x_mooncake_raw"] = r["mooncake_raw_seconds"] / r["seconds"]
    return rows


def in_private_netns() -> bool:
    from bulkhead.disagg.transfer.mooncake_backend import non_loopback_interfaces

    return not non_loopback_interfaces()


def run_mooncake_isolated(reps: int) -> list[dict]:
    """Mooncake listens on every interface: measure it in a namespace with only loopback."""
    cmd = f"ip link set lo up; exec {sys.executable} {__file__} --backends mooncake --reps {reps} --json-only"
    out = subprocess.run(["unshare", "-n", "sh", "-c", cmd], capture_output=True, text=True,
                         env={**os.environ, "GLOG_minloglevel": "2"})
    if out.returncode != 0:
        print(f"mooncake bench failed:\n{out.stderr[-3000:]}", file=sys.stderr)
        return []
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_table(rows: list[dict]) -> None:
    print(f"{'backend':<22}{'pattern':<15}{'GB/s':>7}{'copy GB/s':>11}{'x copy':>8}{'raw GB/s':>10}{'x raw':>7}")
    for r in rows:
        raw = f"{r['mooncake_raw_gb_per_s']:>10.2f}{r['x_mooncake_raw']:>7.2f}" if r.get("x_mooncake_raw") else ""
        print(f"{r['backend']:<22}{r['pattern']:<15}{r['gb_per_s']:>7.2f}{r['copy_gb_per_s']:>11.2f}{r['x_copy']:>8.2f}{raw}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    here = [b for b in args.backends if b != "mooncake" or in_private_netns()]
    rows = run(here, args.reps)
    if args.json_only:
        print(json.dumps(rows))
        return
    if "mooncake" in args.backends and "mooncake" not in here:
        rows += run_mooncake_isolated(args.reps)
    print_table(rows)
    out = ROOT / "bench" / "results" / f"transfer-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"layout": LAYOUT.__dict__, "request_pages": REQUEST_PAGES, "reps": args.reps, "cpus": os.cpu_count(),
            "torch": torch.__version__}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"raw results: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
