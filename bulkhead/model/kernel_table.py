"""Which kernels run a model: one table from (the weights' stored format, the
CPU's features) to (prompt kernel, decode kernel, lm_head kernel). Torch-free,
so the command line and the router can read it.

A format's rows are tried top to bottom; the first whose CPU features this
machine has and whose kernels run here (linear_kernel.runs) wins. Every
format ends on the exact fp32 path (EXACT), which is also what `--precision
exact` runs everywhere. `linear` is the name the engine and /server_info
know a row's prompt and decode kernels by (kernel_names.MATMUL_PRECISION).
The lm_head column's `q8-i16in` is for an lm_head stored as Q8_0 (the
bundled SmolLM2's tied embedding); another lm_head takes `bf16w`
(head_linear.choose_head).

Kernels (docs/performance.md "Kernel flags"): `bf16-in` bf16 inputs and
weights, fp32 sums (csrc/linear_bf16.h); `q4-f32in` the 4-bit grid rebuilt
exactly, fp32 inputs (csrc/linear_q4.h); `q4-i16in`, `q8-i16in` and
`q8a-i16in` the stored codes, inputs as 16-bit integers per group, exact
int32 sums (csrc/linear_i16in.h, linear_q8a.h); `onednn-fp32` oneDNN's fp32
GEMM; lm_head `bf16w` bf16 weights, fp32 inputs (csrc/linear_bf16w.h).
`gguf-i16in` (format_linear) runs each tensor group of a GGUF file on its
own format's decode kernel, where `per_group` says every group has one.
"""

from __future__ import annotations

from typing import NamedTuple

from bulkhead.cpu import CPU_FEATURES, cpu_features  # noqa: F401 - the table reads them here


class Row(NamedTuple):
    formats: tuple[str, ...]  # stored formats (weight_format's names) this row serves
    needs: tuple[str, ...]  # CPU features (/proc/cpuinfo flags) its kernels need
    linear: str  # the linear kernel's name (kernel_names.KERNELS)
    prompt: str
    decode: str
    lm_head: str


GRID_4BIT = ("Q4_0", "Q4_1", "Q4_K")  # Q4_K: decoded onto the same grid (gguf-direct work)
GRID_8BIT = ("Q8_0", "Q5_0")  # int8 codes, a scale per 32 (gguf_codes.Q8Codes)
SCALE_16 = ("Q6_K", "Q5_K", "Q5_1")  # int8 codes, a scale per 16, an offset per 32 (gguf_codes.Q8ACodes)
FP32 = ("F32",)
EXACT = Row(FP32, (), "onednn", "onednn-fp32", "onednn-fp32", "fp32")
BF16, VNNI = "avx512_bf16", "avx512_vnni"
# F16: rounded to bf16 once as it is packed (3 mantissa bits; under the quality
# gate, docs/performance.md); `--precision exact` widens its values exactly.
BF16_ROW = ("BF16", "F16")

TABLE = (
    #   formats      CPU features  linear       prompt         decode        lm_head
    Row(GRID_4BIT, (BF16, VNNI), "q4-i16in",  "bf16-in",     "q4-i16in",   "q8-i16in"),
    Row(GRID_4BIT, (),           "q4",        "onednn-fp32", "q4-f32in",   "bf16w"),
    Row(GRID_8BIT, (BF16, VNNI), "gguf-i16in", "bf16-in",    "q8-i16in",   "q8-i16in"),
    Row(SCALE_16,  (BF16, VNNI), "gguf-i16in", "bf16-in",    "q8a-i16in",  "q8-i16in"),
    Row(BF16_ROW, (BF16,),       "bf16",      "bf16-in",     "bf16-in",    "bf16-in"),
    # A GGUF file whose groups differ (Q4_K_M) runs gguf-i16in where every
    # group's format has a row decoding 16-bit integer inputs
    # (I16IN_DECODES): each group its own row's decode kernel.
)


# Decode kernels over a GGUF tensor's codes as stored (format_linear), which gguf-i16in runs side by side.
I16IN_DECODES = ("q4-i16in", "q8-i16in", "q8a-i16in")


def per_group(formats: set[str], features: frozenset[str]) -> bool:
    """Every one of `formats` (a model's linear groups') has a row here whose
    decode kernel is one of I16IN_DECODES: the model runs gguf-i16in."""
    return bool(formats) and all(any(row.decode in I16IN_DECODES for row in rows_for(f, features))
                                 for f in formats)


def rows_for(stored: str, features: frozenset[str]) -> list[Row]:
    """The rows for weights stored as `stored` on a CPU with `features`, in
    the order to try them, EXACT last."""
    return [row for row in TABLE if stored in row.formats and set(row.needs) <= features] + [EXACT]


def row_of(linear: str) -> Row:
    """The first row naming linear kernel `linear` (EXACT for the exact ones)."""
    return next((row for row in TABLE if row.linear == linear), EXACT)
