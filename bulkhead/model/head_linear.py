"""The lm_head's kernels and their choice. The lm_head's outputs are the
logits, so every kernel here keeps its inputs' sums and its logits fp32
(linear_kernel's docstring says why) and runs each row alone, the same
operations whatever its batch-mates:

- `fp32`: oneDNN over the fp32 weight, the exact model (linear_kernel's);
- `bf16w`: bf16 weights, fp32 inputs (head_kernel): at one request the
  lm_head reads its whole weight per token and is bound by memory;
- `bf16-in`: a bf16 checkpoint's: the same weights, each input row rounded
  to bf16 (bf16in_kernel.linear_bf16_bf16in): at 16 rows `bf16w`'s fp32
  multiply-adds bound it (11.6 ms a step for SmolLM2's 49152 x 576, one
  thread) and a bf16 dot product does twice as many (5.8 ms);
- `q8-i16in`: an lm_head exactly on an 8-bit grid (a GGUF Q8_0 tensor, as
  the bundled SmolLM2's tied embedding is): int8 codes and the file's fp16
  scales (1.0625 bytes a weight, which a one-row step reads whole), inputs
  as 16-bit integers per group (i16in_kernel), exact int32 sums.

`q8-i16in` and `bf16-in` have linear_q4's signature (`tail_kernel`), so the
C decode step runs them after its layers in the same call
(bulkhead.model.decode_layers); `bf16w` and `fp32` run from Python. Which
runs is the kernel table's lm_head column (bulkhead.model.kernel_table).
"""

from __future__ import annotations

import torch

from bulkhead.model import bf16in_kernel, c_linear, head_kernel, i16in_kernel, kernel_table, q4_kernel
from bulkhead.model.kernel_names import EXACT_KERNELS, HEAD_KERNELS
from bulkhead.model.linear import Linear


class _PackedHead(Linear):
    """An lm_head over `packed`, its kernel's layout: `_run(x, packed)` computes each row's fp32 logits."""

    def __call__(self, x, b=None, decode=False):
        y = self._run(x.float(), self.packed)
        return (y if b is None else y + b.float()).to(x.dtype)


class Q8I16InLinear(_PackedHead):
    """The lm_head's `q8-i16in` kernel over pack_q8_0's (codes, fp16 scales)."""

    def __init__(self, packed: tuple[torch.Tensor, torch.Tensor]):
        qb, d = packed
        if qb.dtype != torch.int8 or d.dtype != torch.float16:
            raise ValueError(f"q8-i16in takes int8 codes and fp16 scales, not {qb.dtype} and {d.dtype}")
        self.packed = packed
        self.out_features, self.in_features = qb.shape[0] * q4_kernel.BLOCK, qb.shape[1] * 2

    @classmethod
    def of(cls, w: torch.Tensor) -> Q8I16InLinear:
        packed = pack_q8_0(w)
        if packed is None:
            raise ValueError(f"q8-i16in: weight {tuple(w.shape)} is not exactly on an 8-bit grid")
        return cls(packed)

    @staticmethod
    def _run(x, packed):
        return linear_q8_0_i16in(x, packed)

    def tail_kernel(self):
        """(its C function, linear_q4's signature, and that function's two
        weight tensors) for the C decode step (bulkhead.model.decode_layers),
        or None where the library cannot be loaded here."""
        lib = i16in_kernel.load()
        return None if lib is None else (lib.linear_q8_0_i16in, *self.packed)


def pack_q8_0(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """w [N, K] laid out for linear_q8_0_i16in: i16in_kernel.pack_q8's codes
    and its scales as fp16 (q8_grid's d are of fp16 precision, as Q8_0
    stores them, so the fp16 copy is exact), or None where w is not exactly
    on an 8-bit grid."""
    packed = i16in_kernel.pack_q8(w)
    if packed is None:
        return None
    qb, d = packed
    half = d.half()
    if not torch.equal(half.float(), d):  # q8_grid's contract; checked, since a rounded scale moves every logit
        raise ValueError("q8-i16in: an 8-bit grid scale is not of fp16 precision")
    return qb, half


def linear_q8_0_i16in(x: torch.Tensor, packed: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [M, K] float32 @ w.T -> [M, N] float32, packed = pack_q8_0(w), x
    quantized to 16-bit integers per group inside the call."""
    lib = c_linear.needed(i16in_kernel.load(), "the 16-bit-input kernels")
    qb, d = packed
    blocks, pairs = qb.shape[:2]
    return c_linear.call(lib.linear_q8_0_i16in, x, 2 * pairs, blocks * q4_kernel.BLOCK, qb, d)


class BF16WeightLinear(_PackedHead):
    """The lm_head's `bf16w` kernel over head_kernel.pack's weight."""

    _run = staticmethod(head_kernel.linear_bf16w)

    def __init__(self, packed: torch.Tensor):
        self.packed = packed
        self.out_features, self.in_features = packed.shape[0] * head_kernel.BLOCK, packed.shape[1]


class BF16InputHead(_PackedHead):
    """The lm_head's `bf16-in` kernel over bf16in_kernel.pack's weight."""

    _run = staticmethod(bf16in_kernel.linear_bf16_bf16in)

    def __init__(self, packed: torch.Tensor):
        self.packed = packed
        self.out_features, self.in_features = packed.shape[0] * bf16in_kernel.BLOCK, packed.shape[1] * 2

    def tail_kernel(self):
        """As Q8I16InLinear.tail_kernel: linear_bf16_bf16in and its weight."""
        lib = bf16in_kernel.load()
        return None if lib is None else (lib.linear_bf16_bf16in, self.packed, bf16in_kernel.NO_SECOND_WEIGHT)


# Each lm_head kernel's layer over an [N, K] weight (prepare's).
LAYERS = {"q8-i16in": Q8I16InLinear.of, "bf16w": lambda w: BF16WeightLinear(head_kernel.pack(w)),
          "bf16-in": lambda w: BF16InputHead(bf16in_kernel.pack(w))}


def head_runs(head: str, lm_head: torch.Tensor) -> bool:
    """lm_head kernel `head` runs here (its C kernel builds) on this weight (its shape; an 8-bit grid for q8-i16in)."""
    if lm_head.dtype not in (torch.float32, torch.bfloat16, torch.float16):  # fp16: an F16 checkpoint's, rounded
        return False
    if head == "bf16w":
        return head_kernel.fits(lm_head) and head_kernel.load() is not None
    if head == "bf16-in":
        return bf16in_kernel.load() is not None and bf16in_kernel.fits(lm_head)
    return head == "q8-i16in" and i16in_kernel.load() is not None and i16in_kernel.q8_grid(lm_head) is not None


# Why an lm_head kernel asked for by name cannot run.
_REFUSED = {"bf16-in": "its C kernel cannot run here (no AVX-512 BF16) or does not take this shape",
            "bf16w": "its C kernel cannot run here or does not take this shape",
            "q8-i16in": "its C kernel cannot run here (no AVX-512 VNNI) or the lm_head is not exactly on an "
                        "8-bit grid (a Q8_0 tensor)"}


def choose_head(kernel: str, lm_head: torch.Tensor, asked: str | None = None) -> str:
    """The lm_head's kernel under linear kernel `kernel`: `fp32` under the
    exact ones; else the table's lm_head column for `kernel`'s row where it
    runs here, else `bf16w` where it runs, else `fp32`. `asked` names one
    (tests and bench/decode_step.py); asking for one that cannot run is an error."""
    if asked is not None:
        if asked not in HEAD_KERNELS:
            raise ValueError(f"lm_head kernel must be one of {HEAD_KERNELS}, not {asked!r}")
        if asked in _REFUSED and not head_runs(asked, lm_head):
            raise RuntimeError(f"lm_head kernel {asked}: {_REFUSED[asked]}")
        return asked
    if kernel in EXACT_KERNELS:
        return "fp32"
    for head in (kernel_table.row_of(kernel).lm_head, "bf16w"):
        if head_runs(head, lm_head):
            return head
    return "fp32"
