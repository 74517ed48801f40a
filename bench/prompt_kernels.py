"""Prompt rows through the bf16 prompt kernel against the 4-bit decode kernel
(q4-i16in), one thread's CPU time, the two interleaved: what a decode worker
pays to recompute a preempted prompt on its 4-bit codes instead of holding a
bf16 copy of every weight (format_linear.CodedLinear with no prefill).

    .venv/bin/python bench/prompt_kernels.py              # Llama-3.2-1B's layer shapes
    .venv/bin/python bench/prompt_kernels.py --rows 16,64,256 --repeats 5
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bulkhead.model import bf16in_kernel, i16in_kernel, q4_scales  # noqa: E402
from bulkhead.model.format_linear import CodedLinear  # noqa: E402

# [out, in] of each fused layer of Llama-3.2-1B (bench/big_checkpoint.py's shapes).
SHAPES = {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192)}


def thread_cpu() -> float:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_utime


def grid_layer(n: int, k: int, gen: torch.Generator):
    """A random 4-bit grid weight (Q4_0's form) packed for both kernels."""
    q = torch.randint(0, 16, (n, k // 32, 32), dtype=torch.uint8, generator=gen)
    d = (torch.rand(n, k // 32, 1, generator=gen) * 0.01).half().float()
    w = (q.float() * d - 8 * d).reshape(n, k)
    return bf16in_kernel.pack(w), CodedLinear.from_packed("q4-i16in", q4_scales.pack(q, d, -8 * d), None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="64,256", help="prompt rows per call, comma list")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if bf16in_kernel.load() is None or i16in_kernel.load() is None:
        print("this CPU has no AVX-512 BF16 or VNNI: nothing to compare")
        return 1
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    print("| layer | rows | bf16 prompt kernel ms | q4-i16in decode kernel ms | ratio |\n|---|---|---|---|---|")
    for name, (n, k) in SHAPES.items():
        wb, decode_layer = grid_layer(n, k, gen)
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k, generator=gen)
            runs = {"bf16": lambda: bf16in_kernel.linear_bf16in(x, wb),
                    "q4": lambda: decode_layer(x, decode=True)}
            spent = dict.fromkeys(runs, 0.0)
            for fn in runs.values():
                fn()  # warm
            for _ in range(args.repeats):  # interleaved: the load drifts
                for key, fn in runs.items():
                    start = thread_cpu()
                    fn()
                    spent[key] += thread_cpu() - start
            ms = {key: 1e3 * t / args.repeats for key, t in spent.items()}
            print(f"| {name} | {rows} | {ms['bf16']:.1f} | {ms['q4']:.1f} | {ms['q4'] / ms['bf16']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
