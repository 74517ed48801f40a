"""Would int8 prompt inputs pass the quality gate? bench/quality_gate.py with
every prompt linear's input rounded to int8 per group of 32 (a scale per
group, its largest |x| at 127: llama.cpp's Q8 activations), before the bf16
prompt kernel reads it.

    python bench/int8_inputs_quality.py --formats q4_1 --long 1024 --tokens 16
    python bench/int8_inputs_quality.py --keep-down-bf16 --formats q4_1 --long 1024 --tokens 16

Why: VNNI's int8 dot product does twice `vdpbf16ps`'s multiply-adds, and a
prompt pass is 84% linear layers at ~93% of the bf16 kernel's rate
(docs/performance.md). Simulated, not a kernel: the int8 values are then
rounded to bf16 (exact for |q| <= 127 times a scale with few mantissa
bits, else one more rounding), and the weights stay bf16, so it reads a
little worse than an int8 kernel over the exact 4-bit codes would.
--keep-down-bf16 leaves the down projection's input (SiLU times up, the
widest-ranged) in bf16. Arguments after it go to bench/quality_gate.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import quality_gate  # noqa: E402
from bulkhead.model import linear_kernel  # noqa: E402

GROUP = 32


def int8_rounded(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] as int8 codes times a scale per group of GROUP inputs, in float32."""
    groups = x.float().reshape(x.shape[0], x.shape[1] // GROUP, GROUP)  # 0 rows too (a chunk wanting no logits)
    scale = groups.abs().amax(-1, keepdim=True) / 127
    codes = torch.round(groups / torch.where(scale > 0, scale, 1)).clamp_(-127, 127)
    return (codes * scale).reshape(x.shape)


def install(keep_down_bf16: bool) -> None:
    """BF16InLinear's prompt calls read int8-rounded inputs (the down projection's too, unless kept)."""
    cls = linear_kernel.BF16InLinear
    call, silu_mul = cls.__call__, cls.silu_mul

    def int8_call(self, x, b=None, decode=False):
        if x.dtype == torch.bfloat16:  # the down projection's input, from silu_mul
            return call(self, x if keep_down_bf16 else int8_rounded(x), b, decode)
        return call(self, int8_rounded(x).to(x.dtype), b, decode)

    cls.__call__ = int8_call
    cls.silu_mul = lambda self, x: silu_mul(self, int8_rounded(x))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    keep = "--keep-down-bf16" in argv
    install(keep)
    return quality_gate.main([a for a in argv if a != "--keep-down-bf16"])


if __name__ == "__main__":
    sys.exit(main())
