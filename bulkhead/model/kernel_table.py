"""Which kernels run a model: one table from (the weights' stored format, the
CPU's features) to (prompt kernel, decode kernel, lm_head kernel). Torch-free,
so the command line and the router can read it.

A format's rows are tried top to bottom; the first whose CPU features this
machine has and whose kernels run here (their C library builds, the weights
pack exactly: bulkhead.model.linear_kernel.runs) wins. Every format ends on
the exact fp32 path (EXACT), which is also what `--precision exact` runs
everywhere. `linear` is the name the engine and /server_info know a row's
prompt and decode kernels by (kernel_names.MATMUL_PRECISION says what each
computes in). The lm_head column's `q8-i16in` is for an lm_head stored as
Q8_0 (the bundled SmolLM2's tied embedding); another lm_head in that row
takes `bf16w` (head_linear.choose_head).

Kernels: `bf16-in` bf16 inputs and weights, fp32 sums (csrc/linear_bf16.h;
a bf16 checkpoint's lm_head too, its logits fp32); `q4-f32in` the 4-bit grid
rebuilt exactly, fp32 inputs and sums (csrc/linear_q4.h); `q4-i16in` the same
weights, inputs as 16-bit integers per group, exact int32 sums
(csrc/linear_i16in.h); `onednn-fp32` oneDNN's fp32 GEMM (aten's F.linear
where this torch has no oneDNN); lm_head `bf16w` bf16 weights, fp32 inputs
and logits (csrc/linear_bf16w.h), `q8-i16in` 8-bit weights exactly, 16-bit
integer inputs (csrc/linear_i16in.h), `fp32` oneDNN fp32.
"""

from __future__ import annotations

import functools
from typing import NamedTuple


class Row(NamedTuple):
    formats: tuple[str, ...]  # stored formats (weight_format's names) this row serves
    needs: tuple[str, ...]  # CPU features (/proc/cpuinfo flags) its kernels need
    linear: str  # the linear kernel's name (kernel_names.KERNELS)
    prompt: str
    decode: str
    lm_head: str


GRID_4BIT = ("Q4_0", "Q4_1", "Q4_K")  # Q4_K: decoded onto the same grid (gguf-direct work)
FP32 = ("F32",)
EXACT = Row(FP32, (), "onednn", "onednn-fp32", "onednn-fp32", "fp32")
BF16, VNNI = "avx512_bf16", "avx512_vnni"
# F16: rounded to bf16 once as it is packed (3 mantissa bits; under the quality
# gate, docs/performance.md); `--precision exact` widens its values exactly.
BF16_ROW = ("BF16", "F16")

TABLE = (
    #   formats      CPU features  linear       prompt         decode        lm_head
    Row(GRID_4BIT, (BF16, VNNI), "q4-i16in",  "bf16-in",     "q4-i16in",   "q8-i16in"),
    Row(GRID_4BIT, (BF16,),      "q4-bf16in", "bf16-in",     "q4-f32in",   "bf16w"),
    Row(GRID_4BIT, (),           "q4",        "onednn-fp32", "q4-f32in",   "bf16w"),
    Row(BF16_ROW, (BF16,),       "bf16",      "bf16-in",     "bf16-in",    "bf16-in"),
    # TODO(kernel-table): Q6_K's kernels are the K-quant engineer's pick; until
    # then it takes EXACT. Q8_0 linear layers likewise: the lm_head's q8-i16in
    # micro-kernel could serve their decode rows, an (("Q8_0",), (VNNI,)) row.
)


def rows_for(stored: str, features: frozenset[str]) -> list[Row]:
    """The rows for weights stored as `stored` on a CPU with `features`, in
    the order to try them, EXACT last."""
    return [row for row in TABLE if stored in row.formats and set(row.needs) <= features] + [EXACT]


def row_of(linear: str) -> Row:
    """The first row naming linear kernel `linear` (EXACT for the exact ones)."""
    return next((row for row in TABLE if row.linear == linear), EXACT)


CPU_FEATURES = ("avx512_bf16", "avx512_vnni", "avx512f", "avx2")


@functools.cache
def cpu_features(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The features of CPU_FEATURES that /proc/cpuinfo's flags name; none
    where it cannot be read (another OS): the exact path then."""
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return frozenset()
    return frozenset(CPU_FEATURES) & frozenset(flags)
