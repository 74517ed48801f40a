"""The lm_head's kernels and their choice. The lm_head's outputs are the
logits, so every kernel here keeps its inputs, sums and logits fp32 and
runs each row alone, the same operations whatever its batch-mates:

- `fp32`: oneDNN over the fp32 weight, the exact model (a layer of
  bulkhead.model.linear_kernel's);
- `bf16w`: bf16 weights (bulkhead.model.head_kernel): at one request the
  lm_head reads its whole weight per token and is bound by memory, and bf16
  weights halve its bytes; exact for a bf16 checkpoint;
- `bf16-in`: a bf16 checkpoint's: the same weights, each input row rounded
  to bf16 (the linear layers' decode kernel, bulkhead.model.bf16in_kernel),
  sums and logits fp32: at 16 rows `bf16w`'s fp32 multiply-adds bound it
  (11.6 ms a step for SmolLM2's 49152 x 576, one thread) and a bf16 dot
  product does twice as many (5.8 ms); the logits are never rounded, and
  the quality gate holds the bf16 format to its bound with it
  (docs/performance.md, "Quality");
- `q8-i16in`: for an lm_head exactly on an 8-bit grid (a GGUF Q8_0 tensor,
  as the bundled SmolLM2's tied embedding is), those weights rebuilt
  exactly from int8 codes and the file's fp16 scales, inputs as 16-bit
  integers per group (bulkhead.model.i16in_kernel's quantization).

`q8-i16in` and `bf16-in` have linear_q4's signature (`tail_kernel`), so the
C decode step runs them after its layers in the same call
(bulkhead.model.decode_layers); `bf16w` and `fp32` run from Python.

Which runs is the kernel table's lm_head column (bulkhead.model.kernel_table).
"""

from __future__ import annotations

import torch

from bulkhead.model import bf16in_kernel, c_linear, head_kernel, i16in_kernel, kernel_table, q4_kernel
from bulkhead.model.kernel_names import EXACT_KERNELS, HEAD_KERNELS
from bulkhead.model.linear import Linear


class Q8I16InLinear(Linear):
    """The lm_head's `q8-i16in` kernel: 8-bit grid weights rebuilt exactly,
    inputs as 16-bit integers per group of 32, exact int32 sums, fp32 logits
    (bulkhead.model.i16in_kernel's quantization), the same kernel for every
    row, so a row's logits do not depend on its batch-mates. Its scales are
    fp16, as a Q8_0 file stores them (csrc/linear_q8a.h's linear_q8_0_i16in):
    1.0625 bytes a weight, which a one-row step reads whole."""

    def __init__(self, w: torch.Tensor):
        self.out_features, self.in_features = w.shape
        self.packed = pack_q8_0(w)
        if self.packed is None:
            raise ValueError(f"q8-i16in: weight {tuple(w.shape)} is not exactly on an 8-bit grid")

    @classmethod
    def from_packed(cls, packed: tuple[torch.Tensor, torch.Tensor]) -> Q8I16InLinear:
        """The layer over pack_q8_0's answer as an earlier start cached it (bulkhead.model.prepared_weights)."""
        qb, d = packed
        if qb.dtype != torch.int8 or d.dtype != torch.float16:
            raise ValueError(f"q8-i16in takes int8 codes and fp16 scales, not {qb.dtype} and {d.dtype}")
        layer = cls.__new__(cls)
        layer.packed = packed
        layer.out_features, layer.in_features = qb.shape[0] * q4_kernel.BLOCK, qb.shape[1] * 2
        return layer

    def __call__(self, x, b=None, decode=False):
        y = linear_q8_0_i16in(x.float(), self.packed)
        return (y if b is None else y + b.float()).to(x.dtype)

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
    lib = i16in_kernel.load()
    if lib is None:
        raise RuntimeError("the 16-bit-input kernels are not available")
    qb, d = packed
    blocks, pairs = qb.shape[:2]
    return c_linear.call(lib.linear_q8_0_i16in, x, 2 * pairs, blocks * q4_kernel.BLOCK, qb, d)


def q8_i16in_usable(w: torch.Tensor) -> bool:
    """The 16-bit-input kernels build here and this weight is exactly on an 8-bit grid."""
    return i16in_kernel.load() is not None and i16in_kernel.q8_grid(w) is not None


class BF16WeightLinear(Linear):
    """The lm_head's `bf16w` kernel: bf16 weights, fp32 inputs, sums and
    outputs (bulkhead.model.head_kernel), the same kernel for every row, so a
    row's logits do not depend on its batch-mates."""

    def __init__(self, w: torch.Tensor):
        self._run = head_kernel.linear_bf16w
        self.out_features, self.in_features = w.shape
        self.packed = head_kernel.pack(w)

    @classmethod
    def from_packed(cls, packed: torch.Tensor) -> BF16WeightLinear:
        """The layer over head_kernel.pack's answer as an earlier start cached it."""
        layer = cls.__new__(cls)
        layer._run, layer.packed = head_kernel.linear_bf16w, packed
        layer.out_features, layer.in_features = packed.shape[0] * head_kernel.BLOCK, packed.shape[1]
        return layer

    def __call__(self, x, b=None, decode=False):
        y = self._run(x.float(), self.packed)
        return (y if b is None else y + b.float()).to(x.dtype)


class BF16InputHead(Linear):
    """The lm_head's `bf16-in` kernel: bf16 weights, each row rounded to bf16,
    fp32 sums and logits (bf16in_kernel.linear_bf16_bf16in), each row alone."""

    def __init__(self, w: torch.Tensor):
        self.out_features, self.in_features = w.shape
        self.packed = bf16in_kernel.pack(w)

    @classmethod
    def from_packed(cls, packed: torch.Tensor) -> BF16InputHead:
        """The layer over bf16in_kernel.pack's answer as an earlier start cached it."""
        layer = cls.__new__(cls)
        layer.packed = packed
        layer.out_features, layer.in_features = packed.shape[0] * bf16in_kernel.BLOCK, packed.shape[1] * 2
        return layer

    def __call__(self, x, b=None, decode=False):
        y = bf16in_kernel.linear_bf16_bf16in(x.float(), self.packed)
        return (y if b is None else y + b.float()).to(x.dtype)

    def tail_kernel(self):
        """As Q8I16InLinear.tail_kernel: linear_bf16_bf16in and its weight."""
        lib = bf16in_kernel.load()
        return None if lib is None else (lib.linear_bf16_bf16in, self.packed, bf16in_kernel.NO_SECOND_WEIGHT)


def bf16w_usable(w: torch.Tensor) -> bool:
    """The bf16-weight kernel builds here (with torch's OpenMP team) and takes this weight's shape."""
    return head_kernel.fits(w) and head_kernel.load() is not None


def head_runs(head: str, lm_head: torch.Tensor) -> bool:
    if lm_head.dtype not in (torch.float32, torch.bfloat16, torch.float16):  # fp16: an F16 checkpoint's, rounded
        return False
    if head == "bf16w":
        return bf16w_usable(lm_head)
    if head == "bf16-in":
        return bf16in_kernel.load() is not None and bf16in_kernel.fits(lm_head)
    return head == "q8-i16in" and q8_i16in_usable(lm_head)


def choose_head(kernel: str, lm_head: torch.Tensor, asked: str | None = None) -> str:
    """The lm_head's kernel under linear kernel `kernel`: `fp32` under the
    exact ones; else the table's lm_head column for `kernel`'s row where it
    runs here (`q8-i16in` needs an lm_head exactly on an 8-bit grid: a Q8_0
    tensor), else `bf16w` where it runs, else `fp32`. `asked` names one (tests and bench/decode_step.py);
    asking for one that cannot run is an error."""
    if asked is not None:
        if asked not in HEAD_KERNELS:
            raise ValueError(f"lm_head kernel must be one of {HEAD_KERNELS}, not {asked!r}")
        if asked == "bf16-in" and not head_runs(asked, lm_head):
            raise RuntimeError("lm_head kernel bf16-in: its C kernel cannot run here (no AVX-512 BF16) or does not "
                               "take this shape")
        if asked == "bf16w" and not bf16w_usable(lm_head):
            raise RuntimeError("lm_head kernel bf16w: its C kernel cannot run here or does not take this shape")
        if asked == "q8-i16in" and not q8_i16in_usable(lm_head):
            raise RuntimeError("lm_head kernel q8-i16in: its C kernel cannot run here (no AVX-512 VNNI) or the "
                               "lm_head is not exactly on an 8-bit grid (a Q8_0 tensor)")
        return asked
    if kernel in EXACT_KERNELS:
        return "fp32"
    for head in (kernel_table.row_of(kernel).lm_head, "bf16w"):
        if head_runs(head, lm_head):
            return head
    return "fp32"
