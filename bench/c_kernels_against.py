"""One decode step with this tree's C kernels against another checkout's, in one process.

    python bench/c_kernels_against.py --against /tmp/parent
    python bench/c_kernels_against.py --against /tmp/parent --model /tmp/peers-ckpt/smollm2-q4_0.gguf --parts

Builds the model and runner as bench/decode_step.py does (the kernel
table's kernels, bf16 KV, guards on), then compiles the other checkout's
csrc/linear.c and csrc/paged_decode_attention.c with this tree's flags and
swaps their entry points into the C decode layers' model (decode_layers.c
calls both through pointers), rep by rep, interleaved, in this thread's CPU
time. The rest of the step (glue, lm_head, Python) is this tree's in both:
the ratio is the two kernels' share. --parts adds each kernel swapped alone.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

import decode_step  # noqa: E402
from bulkhead.model import c_linear, decode_kernel  # noqa: E402


def address(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


def their_kernels(other: Path, runner, linear_name: str) -> tuple[int, int]:
    """(linear, attention) entry points of the other checkout's sources, built with this tree's flags."""
    mc, kv = runner.model.config, runner.pool.data.dtype
    kv_name = decode_kernel._kv_name(kv)
    cc = decode_kernel._compiler()
    attention_flags = [*decode_kernel.FLAGS, f"-DHEAD_DIM={mc.head_dim}",
                       f"-DGROUP={mc.num_heads // mc.num_kv_heads}", f"-DPAGE_SIZE={runner.pool.layout.page_size}",
                       *decode_kernel.KV_DTYPES[kv_name][0], "-fopenmp"]
    linear_flags = [*decode_kernel.FLAGS, "-fopenmp", "-ffp-contract=off"]
    csrc = other / "bulkhead" / "model" / "csrc"
    attention = ctypes.CDLL(str(decode_kernel._build(cc, attention_flags, csrc / "paged_decode_attention.c")))
    linear = ctypes.CDLL(str(decode_kernel._build(cc, linear_flags, csrc / "linear.c")))
    return address(getattr(linear, linear_name)), address(attention.paged_decode_attention)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", type=Path, required=True, help="the other checkout's repository root")
    ap.add_argument("--model", type=Path, default=None, help="a model directory or GGUF file (default: the bundled)")
    ap.add_argument("--requests", default="16,1", help="comma list of decode batch sizes")
    ap.add_argument("--context", type=int, default=320, help="KV positions per request")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--parts", action="store_true", help="also each kernel swapped alone")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    sizes = [int(n) for n in args.requests.split(",")]
    runner, pages, chosen = decode_step.build("auto", None, max(sizes), args.context, "bfloat16", "auto", args.model)
    layers = runner.model._c_layers
    if layers is None:
        ap.error(f"{chosen} does not run the C decode layers: nothing to swap")
    runner.run(decode_step.plan(pages, max(sizes), args.context))  # binds the layers' model struct
    model = layers._model
    name = runner.model.weights.layers[0].qkv.decode_fn().__name__
    ours = (model.linear, model.attention)
    theirs = their_kernels(args.against.resolve(), runner, name)
    assert ours[0] == address(getattr(c_linear.load(), name))
    variants = {"theirs": theirs, "ours": ours}
    if args.parts:
        variants |= {"ours: attention only": (theirs[0], ours[1]), "ours: linear only": (ours[0], theirs[1])}
    print(f"{chosen} ({name}), bf16 KV, {args.context} positions, one thread's CPU time, {args.reps} reps "
          f"interleaved; theirs: {args.against}")
    for n in sizes:
        times = {v: [] for v in variants}
        for r in range(args.reps + 3):  # three warm-up reps
            for v in list(variants) if r % 2 == 0 else list(variants)[::-1]:
                model.linear, model.attention = variants[v]
                plan = decode_step.plan(pages, n, args.context)
                t = time.thread_time()
                runner.run(plan)
                if r >= 3:
                    times[v].append((time.thread_time() - t) * 1e3)
        base = statistics.median(times["theirs"])
        for v, ts in times.items():
            q = statistics.quantiles(ts, n=4)
            print(f"{n:>3} rows, {v:<22} median {statistics.median(ts):7.2f} ms ({q[0]:.2f}..{q[2]:.2f}), "
                  f"{statistics.median(ts) / base:.3f}x theirs")
    model.linear, model.attention = ours
    return 0


if __name__ == "__main__":
    sys.exit(main())
