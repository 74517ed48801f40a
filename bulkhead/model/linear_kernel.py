"""Which kernel runs the linear layers, and the weights laid out for it.

| kernel | prefill | decode | weights held |
|---|---|---|---|
| `aten` | `F.linear` (MKL sgemm), fp32 | same | fp32 |
| `onednn` | oneDNN over a laid-out fp32 weight | same | fp32 |
| `onednn-bf16` | oneDNN, bf16 inputs and weights, fp32 accumulation | same | bf16 |
| `int4` | as `onednn` | 4-bit weights, groups of 32 along the input, bf16 scale and zero per group; bf16 inputs | fp32 and int4 |
| `q4` | as `onednn` | the 4-bit grid weights rebuilt exactly, fp32 inputs and sums (bulkhead.model.q4_kernel) | fp32 and 4-bit |
| `q4-bf16in` | the 4-bit grid weights rounded to bf16, bf16 inputs, fp32 sums (bulkhead.model.bf16in_kernel) | as `q4` | 4-bit and bf16 |
| `q4-bf16in-all` | as `q4-bf16in` | the 4-bit grid weights rebuilt exactly from the nibbles, bf16 inputs, fp32 sums (bulkhead.model.q4_bf16in_kernel) | 4-bit and bf16 |
| `q4-i16in` | as `q4-bf16in` | the 4-bit q times inputs quantized to 16-bit integers per group, exact int32 sums, fp32 scales (bulkhead.model.i16in_kernel) | 4-bit and bf16 |
| `q4-bf16-prefill` | as `onednn-bf16` | as `q4` | bf16 and 4-bit |
| `bf16` | bf16 inputs and weights, fp32 sums (bulkhead.model.bf16in_kernel) | the same bf16 weights, fp32 inputs and sums | bf16, once |

The lm_head (its outputs are the logits) has kernels of its own (`choose_head`
below): `fp32` (oneDNN over the fp32 weight, the exact model), `bf16w`
(bf16 weights, fp32 inputs, sums and logits: bulkhead.model.head_kernel) or,
instead of bf16w under `q4-i16in` for an lm_head that is exactly 8-bit (a GGUF Q8_0 tensor,
as the bundled SmolLM2's tied embedding is), `q8-i16in` (those weights
rebuilt exactly, inputs as 16-bit integers per group, fp32 logits:
bulkhead.model.i16in_kernel).
The reduced-precision kernels (`REDUCED`: `q4`, `q4-bf16in`, `q4-bf16in-all`,
`q4-i16in`, `int4`, `onednn-bf16`, `q4-bf16-prefill`) take `bf16w` where its C kernel builds here
(the lm_head is then half the bytes at one request, where it is bound by
memory), `aten` and `onednn` keep `fp32`.

`auto` is `q4-i16in` for weights that lie exactly on a 4-bit grid (a Q4_0
or Q4_1 GGUF, such as the bundled SmolLM2: every weight rebuilds bit for bit
from a 4-bit q and its group's scale and offset) on a CPU with AVX-512 BF16
and VNNI, and `q4-bf16in` on one with AVX-512 BF16 alone. Its prompts are
`q4-bf16in`'s:
a third to a half of a 16-client run is prefill, bound by arithmetic, and
bf16 dot products do twice fp32's multiply-adds. The prompt rows' inputs
are rounded to bf16 and so are the weights, once at load (sums and outputs
stay fp32); its measured distance from the exact model is in
docs/performance.md "Quality". (The exact 4-bit weights, q in bf16 with each
group's sum scaled in fp32, measured 5.1e-5 nats against 6.0e-5 for the
default, and their matmuls ran 1.2-1.3x slower.) Beside it the engine runs prompts' attention
on bf16 dot products too (bulkhead.model.prefill_attention). Without AVX-512
BF16, or where its C kernel does not build, `auto` is `q4`, whose prompts
are oneDNN fp32.
A 16-row decode step is bound by its matmuls' arithmetic (fp32 FMA at the
cores' peak under `q4`), and both kernels below do twice the multiply-adds
per instruction. `q4-i16in`'s decode rows quantize each group of 32 inputs
to 16-bit integers (each within 2^-16 of the group's largest |x|) against
the exact 4-bit q, so a group's products sum exactly in int32; its measured
distance from the exact model is in docs/performance.md "Quality".
`q4-bf16in-all` rounds decode rows' inputs to bf16 instead (against the
exact 4-bit weights), at the same speed and about twenty times the error per
matmul: opt-in, never `auto`.
`q4-bf16-prefill` (oneDNN's bf16 GEMM for prompts, which also rounds the
weights and each output to bf16) is opt-in, never `auto`: it answered the
README's question in French (0.08 nats from a tie in fp32).

Weights stored in bf16 (a safetensors checkpoint's dtype:
bulkhead.model.weight_format) take `bf16` on a CPU with AVX-512 BF16:
held once, as stored (nothing is rounded), in the prompt kernel's packing;
prompt rows as `q4-bf16in`'s (bf16 inputs, fp32 sums), decode rows with
fp32 inputs and sums against the same bf16 weights (half fp32's bytes),
the lm_head `bf16w` (exact for such a checkpoint). Its measured distance
from the exact model is in docs/performance.md "Quality".

For other weights `auto` is `int4` for weights near such a grid
(`on_4bit_grid`) where this build runs it; otherwise `onednn` where this
build runs it, else `aten`, the exact fp32 model. `q4` computes the exact model's numbers, up to the order of each
sum, reading 4 bits a weight: faster than `int4` at every batch size measured
(docs/performance.md), and without its bf16 inputs. `q4-bf16in`, `q4-bf16in-all`,
`int4` and `onednn-bf16` are not the exact fp32 model and say so in `/server_info`;
each matmul's output returns to fp32, and the lm_head's inputs, sums and
logits stay fp32 whatever its weights.

Why oneDNN: on this project's 2-core AMD EPYC machine MKL's sgemm runs the
whole model's linear layers 3.7x slower at 4 rows than oneDNN's kernel over a
weight laid out for it ahead of time, which is also what vLLM's CPU build
runs. Why bf16: the CPU has AVX-512 BF16, where oneDNN's bf16 GEMM reads half
the bytes and runs 1.7-2x faster than its fp32 one, at prefill sizes too.
Why int4 for decode only: a decode step reads every weight for a handful of
rows, so it is bound by memory, and 4-bit weights read 8x fewer bytes than
fp32 (4.8 vs 24 ms for SmolLM2's layers at 1 row, measured); torch's int4
kernel computes slower than oneDNN past ~16 rows, and a prompt's pass makes
its first token, so `int4` keeps prompts exact fp32 (with oneDNN's bf16
prompts, the README's question, 0.08 nats from a tie in fp32, was answered in
French). The bundled
SmolLM2 ships as Q4_1 (4-bit, groups of 32), so its linear weights are 4-bit
to begin with (`on_4bit_grid`).

Batch invariance is not assumed of any kernel: the engine measures at
start-up, through the decode path of these weights, which decode row counts
give a row the same numbers whatever its batch-mates
(bulkhead.model.row_invariance). A request's decode rows always take the
decode kernel, whatever the batch size, so the choice itself never depends on
batch-mates.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.nn.functional as F

from bulkhead.model import bf16in_kernel, head_kernel, i16in_kernel, q4_bf16in_kernel, q4_kernel

log = logging.getLogger(__name__)

from bulkhead.model.kernel_names import (  # noqa: E402  (torch-free: the command line reads them too)
    BF16_INPUT_PROMPTS, DECODE_INPUTS, HEAD_KERNELS, HEAD_PRECISION, KERNELS, MATMUL_PRECISION, Q4_KERNELS, REDUCED,
    ROW_BY_ROW_HEADS,
)

# The row count oneDNN lays a weight out for; any count runs on it. Measured
# here with the check of bulkhead.model.row_invariance over the model's
# shapes, hints 1, 4 and 16 all give R = 2 (a 1-row result differs from the
# same row in a bigger batch); 16 is the decode batch this is tuned for.
ROWS_HINT = 16
INT4_GROUP = 32  # input features per scale/zero pair, as Q4_0/Q4_1 GGUF weights have


class Linear:
    """One linear layer's weight, prepared for a kernel: `layer(x, b,
    decode)` is x @ w.T + b in x's dtype. `decode` says the rows are decode
    rows (one per request), which some kernels run differently; a caller
    must pass it by phase, never by row count, so that a request's kernel
    does not depend on how many others share its step."""

    out_features: int
    in_features: int

    def __call__(self, x: torch.Tensor, b: torch.Tensor | None = None, decode: bool = False) -> torch.Tensor:
        raise NotImplementedError

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """For a fused gate_up layer [2 I, D] (gate's outputs, then up's):
        silu(gate) * up of prompt rows x in one pass, where this layer's
        prompt kernel has one; None where it has not (the caller runs the
        layer, then the product). Its dtype is the one the same kernel's
        down projection reads without a further rounding (bf16 from the
        bf16-input prompt kernel); every layer of a model shares a kernel."""
        return None


class AtenLinear(Linear):
    def __init__(self, w: torch.Tensor):
        self.w = w.contiguous()
        self.out_features, self.in_features = w.shape

    def __call__(self, x, b=None, decode=False):
        return F.linear(x, self.w, b)


class OneDNNLinear(Linear):
    """oneDNN's linear over a weight reordered once for it, computing in
    `dtype` (fp32, or bf16 with fp32 accumulation)."""

    def __init__(self, w: torch.Tensor, dtype: torch.dtype = torch.float32):
        self.dtype = dtype
        self.out_features, self.in_features = w.shape
        self.w = torch.ops.mkldnn._reorder_linear_weight(w.contiguous().to(dtype), ROWS_HINT)

    def __call__(self, x, b=None, decode=False):
        y = torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.w, None if b is None else b.to(self.dtype),
                                               "none", [], "")
        return y.to(x.dtype)


def _groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] as groups [N, K / INT4_GROUP, INT4_GROUP] with each group's min
    and max ([N, K / INT4_GROUP, 1]): the grid Int4Linear quantizes to and
    on_4bit_grid checks against."""
    groups = w.float().reshape(w.shape[0], -1, INT4_GROUP)
    return groups, groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)


class Int4Linear(Linear):
    """Decode rows through torch's int4 weight-only kernel (bf16 activations);
    other rows through `prefill` (a oneDNN layer over the same weight).

    Quantization: per group of INT4_GROUP input features, asymmetric over
    [min, max] in 16 steps, as GGUF's Q4_1 does: w ~ (q - 8) * scale + zero.
    scale and zero are rounded to bf16 (the kernel's format) before q is
    chosen, so q is the nearest step of the grid the kernel will use."""

    def __init__(self, w: torch.Tensor, prefill: Linear):
        self.prefill = prefill
        self.out_features, self.in_features = w.shape
        n, k = w.shape
        groups, lo, hi = _groups(w)
        scale = ((hi - lo) / 15).clamp_min(torch.finfo(torch.float32).tiny).bfloat16()
        zero = (lo + 8 * scale.float()).bfloat16()
        q = torch.round((groups - zero.float()) / scale.float() + 8).clamp_(0, 15).to(torch.int32).reshape(n, k)
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)  # [N, K / 2] uint8
        self.scale_zero = torch.stack([scale.squeeze(-1).t(), zero.squeeze(-1).t()], -1).contiguous()  # [K/G, N, 2]

    @staticmethod
    def fits(w: torch.Tensor) -> bool:
        """The kernel's shape rules: whole groups along the input, N a multiple of 16."""
        return w.shape[1] % INT4_GROUP == 0 and w.shape[0] % 16 == 0

    def __call__(self, x, b=None, decode=False):
        if not decode:
            return self.prefill(x, b)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), self.packed, INT4_GROUP, self.scale_zero)
        if b is not None:
            y = y + b.bfloat16()
        return y.to(x.dtype)


class Q4Linear(Linear):
    """Decode rows through a kernel over the 4-bit packing (q4_kernel.pack):
    by `decode_inputs`, fp32 inputs and sums (bulkhead.model.q4_kernel),
    bf16 inputs (q4_bf16in_kernel.linear_q4_nibbles) or 16-bit integer
    inputs (bulkhead.model.i16in_kernel); other rows through `prefill` (a
    layer over the same weight)."""

    # decode_inputs -> (the module that loads the C library, its function with linear_q4's signature)
    _KERNEL = {"fp32": (q4_kernel, "linear_q4"), "bf16": (q4_bf16in_kernel, "linear_q4_nibbles_bf16in"),
               "i16": (i16in_kernel, "linear_q4_i16in")}

    def __init__(self, packed: tuple[torch.Tensor, torch.Tensor], prefill: Linear, decode_inputs: str = "fp32"):
        if decode_inputs not in self._KERNEL:
            raise ValueError(f"decode inputs must be one of {tuple(self._KERNEL)}, not {decode_inputs!r}")
        self.packed = packed
        self.prefill = prefill
        self.decode_inputs = decode_inputs
        self.out_features, self.in_features = prefill.out_features, prefill.in_features

    def decode_fn(self):
        """The C function decode rows run (linear_q4's signature; the C decode
        layers call it too), or None where its library cannot be loaded here."""
        module, name = self._KERNEL[self.decode_inputs]
        lib = module.load()
        return None if lib is None else getattr(lib, name)

    def __call__(self, x, b=None, decode=False):
        if not decode:
            return self.prefill(x, b)
        fn = self.decode_fn()
        if fn is None:
            raise RuntimeError(f"the {self.decode_inputs}-input 4-bit decode kernel is not available here")
        y = q4_kernel.call_packed(fn, x.float(), self.packed)
        return (y if b is None else y + b.float()).to(x.dtype)

    def silu_mul(self, x):
        return self.prefill.silu_mul(x)  # prompt rows: the prompt kernel's


class BF16InLinear(Linear):
    """Prompt rows through bf16 weights with bf16 inputs and fp32 sums and
    outputs (bulkhead.model.bf16in_kernel); `wb` the packed weight. Rows
    already bf16 (silu_mul's) are read as they are, with float32 out."""

    def __init__(self, wb: torch.Tensor):
        self.wb = wb
        self.out_features, self.in_features = wb.shape[0] * bf16in_kernel.BLOCK, wb.shape[1] * 2

    def __call__(self, x, b=None, decode=False):
        rounded = x.dtype == torch.bfloat16
        y = bf16in_kernel.linear_bf16in(x if rounded else x.float(), self.wb)
        y = y if b is None else y + b.float()
        return y if rounded else y.to(x.dtype)

    def silu_mul(self, x):
        """bfloat16, rounded as this kernel rounds a layer's input: for the
        down projection's prompt kernel, which reads it as it is."""
        if not bf16in_kernel.silu_mul_fits(self.wb):
            return None
        return bf16in_kernel.linear_bf16in_silu_mul(x.float(), self.wb)


class BF16Linear(Linear):
    """A bf16 checkpoint's layer (`bf16`): its weights held once, in bf16 as
    stored (bf16in_kernel.pack rounds nothing), prompt rows through
    BF16InLinear, decode rows with fp32 inputs and sums
    (bf16in_kernel.linear_bf16_f32in), which the C decode layers call too."""

    decode_inputs = "fp32"

    def __init__(self, prefill: BF16InLinear):
        self.prefill = prefill
        self.packed = (prefill.wb, bf16in_kernel.NO_SECOND_WEIGHT)  # the C decode layers' two weight pointers
        self.out_features, self.in_features = prefill.out_features, prefill.in_features

    def decode_fn(self):
        """The C function decode rows run (linear_q4's signature), or None where it cannot be loaded."""
        lib = bf16in_kernel.load()
        return None if lib is None else lib.linear_bf16_f32in

    def __call__(self, x, b=None, decode=False):
        if not decode:
            return self.prefill(x, b)
        y = bf16in_kernel.linear_bf16_f32in(x.float(), self.prefill.wb)
        return (y if b is None else y + b.float()).to(x.dtype)

    def silu_mul(self, x):
        return self.prefill.silu_mul(x)


def bf16_usable(weights, dtype: torch.dtype) -> bool:
    """The bf16 kernels build here and every linear weight is a bf16 value
    held exactly (a bf16 checkpoint, loaded into fp32) in a shape they take."""
    if dtype != torch.float32 or bf16in_kernel.load() is None or weights is None:
        return False
    return all(bf16in_kernel.fits(w) and torch.equal(w.bfloat16().float(), w)
               for layer in weights.layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down))


def q4_usable(weights) -> bool:
    """The 4-bit kernel builds here and every linear weight it would take
    lies exactly on a 4-bit grid (q4_kernel.grid)."""
    if q4_kernel.load() is None or weights is None:
        return False
    return all(q4_kernel.grid(w) is not None
               for layer in weights.layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down))


def onednn_usable(dtype: torch.dtype) -> bool:
    """This torch build has oneDNN and it runs a reordered linear of this dtype."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        y = OneDNNLinear(torch.ones(8, 8), dtype)(torch.ones(2, 8))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return bool(torch.all(y == 8))


def int4_usable() -> bool:
    """This torch build has the CPU int4 weight-only kernel."""
    try:
        w = torch.ones(16, INT4_GROUP)
        y = Int4Linear(w, AtenLinear(w))(torch.ones(2, INT4_GROUP), decode=True)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return bool(torch.allclose(y, torch.full_like(y, INT4_GROUP)))


def on_4bit_grid(weights) -> bool:
    """Every linear weight the int4 kernel would take holds, in each group of
    INT4_GROUP inputs, only values of a 16-step grid from the group's min to
    its max (to 1e-3 of a step): 4-bit weights dequantized, so int4 loses
    nothing but the rounding of scale and zero to bf16."""
    for layer in weights.layers:
        for w in (layer.qkv, layer.o, layer.gate_up, layer.down):
            if not Int4Linear.fits(w):
                return False
            groups, lo, hi = _groups(w)
            step = (hi - lo) / 15
            off_grid = (groups - lo - torch.round((groups - lo) / step.clamp_min(1e-30)) * step).abs()
            if bool((off_grid > 1e-3 * step + 1e-7 * groups.abs()).any()):
                return False
    return True


def choose(kernel: str, dtype: torch.dtype, weights=None, stored: str | None = None) -> str:
    """Resolve "auto" to a kernel this build can run (int4 only for weights
    given and on a 4-bit grid; bf16 only for weights `stored` as "BF16",
    bulkhead.model.weight_format.linear_format); refuse one it cannot run."""
    if kernel not in KERNELS:
        raise ValueError(f"linear kernel must be one of {KERNELS}, not {kernel!r}")
    if kernel == "aten":
        return "aten"
    if kernel == "bf16" or (kernel == "auto" and stored == "BF16"):
        if bf16_usable(weights, dtype):
            log.info("linear weights stored in bf16: bf16-weight kernels, bf16-input prompts")
            return "bf16"
        if kernel == "bf16":
            raise RuntimeError("--linear-kernel bf16: its C kernel cannot be built here (no AVX-512 BF16), "
                               "--dtype is not float32, or a linear weight is not a bf16 value")
    def bf16in_usable() -> bool:  # bf16-input prompts; oneDNN for an fp32 lm_head where bf16w cannot run
        return dtype == torch.float32 and bf16in_kernel.load() is not None and onednn_usable(dtype) \
            and q4_usable(weights)

    if kernel == "q4-bf16in-all" and bf16in_usable() and q4_bf16in_kernel.load() is not None:
        return kernel
    if kernel in ("auto", "q4-i16in") and bf16in_usable() and i16in_kernel.load() is not None:
        log.info("linear weights lie exactly on a 4-bit grid: 16-bit-input decode kernel, bf16-input prompt kernel")
        return "q4-i16in"
    if kernel in ("auto", "q4-bf16in") and bf16in_usable():
        log.info("linear weights lie exactly on a 4-bit grid: q4 decode kernel, bf16-input prompt kernel")
        return "q4-bf16in"
    if kernel in ("auto", "q4") and dtype == torch.float32 and onednn_usable(dtype) and q4_usable(weights):
        log.info("linear weights lie exactly on a 4-bit grid: q4 decode kernel")
        return "q4"
    if kernel == "q4-bf16-prefill" and dtype == torch.float32 and onednn_usable(torch.bfloat16) \
            and q4_usable(weights):
        return kernel
    if kernel in Q4_KERNELS:
        raise RuntimeError(f"--linear-kernel {kernel}: its C kernel cannot be built here, "
                           + {"q4": "", "q4-bf16in": "this CPU has no AVX-512 BF16, ",
                              "q4-bf16in-all": "this CPU has no AVX-512 BF16, ",
                              "q4-i16in": "this CPU has no AVX-512 BF16 or no AVX-512 VNNI, ",
                              "q4-bf16-prefill": "this torch build cannot run oneDNN bf16, "}[kernel]
                           + ("--dtype is not float32, " if dtype != torch.float32 else "")
                           + "or a linear weight is not exactly on a 4-bit grid (a Q4_0 / Q4_1 model)")
    if kernel == "auto" and weights is not None and dtype == torch.float32 and onednn_usable(torch.bfloat16) \
            and int4_usable() and on_4bit_grid(weights):
        log.info("linear weights lie on a 4-bit grid: int4 decode kernel")
        return "int4"
    if kernel in ("onednn-bf16", "int4"):
        if not onednn_usable(torch.bfloat16):
            raise RuntimeError(f"--linear-kernel {kernel}: this torch build cannot run oneDNN bf16 linear layers")
        if kernel == "int4" and not int4_usable():
            raise RuntimeError("--linear-kernel int4: this torch build has no CPU int4 weight-only kernel")
        return kernel
    if onednn_usable(dtype):
        return "onednn"
    if kernel == "onednn":
        raise RuntimeError("--linear-kernel onednn: this torch build cannot run oneDNN linear layers")
    log.info("oneDNN linear layers unavailable in this torch build; using F.linear")
    return "aten"


class Q8I16InLinear(Linear):
    """The lm_head's `q8-i16in` kernel: 8-bit grid weights rebuilt exactly,
    inputs as 16-bit integers per group of 32, exact int32 sums, fp32 logits
    (bulkhead.model.i16in_kernel), the same kernel for every row, so a row's
    logits do not depend on its batch-mates."""

    def __init__(self, w: torch.Tensor):
        self.out_features, self.in_features = w.shape
        self.packed = i16in_kernel.pack_q8(w)
        if self.packed is None:
            raise ValueError(f"q8-i16in: weight {tuple(w.shape)} is not exactly on an 8-bit grid")

    @classmethod
    def from_packed(cls, packed: tuple[torch.Tensor, torch.Tensor]) -> Q8I16InLinear:
        """The layer over pack_q8's answer as an earlier start cached it (bulkhead.model.prepared_weights)."""
        layer = cls.__new__(cls)
        qb, d = layer.packed = packed
        layer.out_features, layer.in_features = qb.shape[0] * q4_kernel.BLOCK, qb.shape[1] * 2
        return layer

    def __call__(self, x, b=None, decode=False):
        y = i16in_kernel.linear_q8_i16in(x.float(), self.packed)
        return (y if b is None else y + b.float()).to(x.dtype)


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


def bf16w_usable(w: torch.Tensor) -> bool:
    """The bf16-weight kernel builds here (with torch's OpenMP team) and takes this weight's shape."""
    return head_kernel.fits(w) and head_kernel.load() is not None


def choose_head(kernel: str, lm_head: torch.Tensor, asked: str | None = None) -> str:
    """The lm_head's kernel for a chosen linear kernel: `q8-i16in` under
    `q4-i16in` where the lm_head is exactly 8-bit and the kernel runs here,
    else `bf16w` under the reduced-precision kernels where it runs here,
    `fp32` otherwise (and always under `aten` and `onednn`, the exact
    model). `asked` names one (tests and bench/decode_step.py); asking for
    one that cannot run is an error."""
    if asked is not None:
        if asked not in HEAD_KERNELS:
            raise ValueError(f"lm_head kernel must be one of {HEAD_KERNELS}, not {asked!r}")
        if asked == "bf16w" and not bf16w_usable(lm_head):
            raise RuntimeError("lm_head kernel bf16w: its C kernel cannot run here or does not take this shape")
        if asked == "q8-i16in" and not q8_i16in_usable(lm_head):
            raise RuntimeError("lm_head kernel q8-i16in: its C kernel cannot run here (no AVX-512 VNNI) or the "
                               "lm_head is not exactly on an 8-bit grid (a Q8_0 tensor)")
        return asked
    if kernel == "q4-i16in" and q8_i16in_usable(lm_head):
        return "q8-i16in"
    if kernel in REDUCED and lm_head.dtype == torch.float32 and bf16w_usable(lm_head):
        return "bf16w"
    return "fp32"


def prepare_one(w: torch.Tensor, kernel: str) -> Linear:
    """One [out, in] weight laid out for a chosen kernel."""
    if kernel == "aten":
        return AtenLinear(w)
    if kernel == "onednn":
        return OneDNNLinear(w, w.dtype)
    if kernel == "onednn-bf16":
        return OneDNNLinear(w, torch.bfloat16)
    if kernel == "int4":
        prefill = OneDNNLinear(w, w.dtype)
        return Int4Linear(w, prefill) if Int4Linear.fits(w) else prefill
    if kernel == "bf16":
        return BF16Linear(BF16InLinear(bf16in_kernel.pack(w)))
    if kernel in Q4_KERNELS:
        packed = q4_kernel.pack(w)
        if packed is None:
            raise ValueError(f"{kernel}: weight {tuple(w.shape)} is not exactly on a 4-bit grid (see choose())")
        if kernel in BF16_INPUT_PROMPTS:  # no fp32 copy of the weight: prompts read it in bf16
            return Q4Linear(packed, BF16InLinear(bf16in_kernel.pack(w)),
                            DECODE_INPUTS.get(kernel, "fp32"))
        return Q4Linear(packed, OneDNNLinear(w, w.dtype if kernel == "q4" else torch.bfloat16))
    raise ValueError(f"prepare_one() takes a chosen kernel, not {kernel!r} (see choose())")


def prepare(weights, kernel: str, head: str | None = None):
    """The model's weights with every linear layer's laid out for `kernel`
    (a ModelWeights; returned as a new one, the input is not changed), the
    lm_head's for `head` (choose_head's answer when None). The laid-out
    copy replaces the plain one; a tied embedding stays for token lookup,
    except under a `q8-i16in` lm_head, whose 8-bit copy holds its exact
    numbers (bulkhead.model.q8_embedding).

    The lm_head's outputs stay fp32 on every kernel: they are the logits,
    and bf16 keeps 8 bits of them, steps of 0.125 at a logit of 20. Measured
    on the README's question: fp32 puts "The" 0.08 nats above "L"; with a
    bf16 GEMM lm_head (oneDNN's, which rounds output and inputs) they tie and
    greedy decoding answers in French. `bf16w` rounds only the weights."""
    layers = [dataclasses.replace(layer, qkv=prepare_one(layer.qkv, kernel), o=prepare_one(layer.o, kernel),
                                  gate_up=prepare_one(layer.gate_up, kernel), down=prepare_one(layer.down, kernel))
              for layer in weights.layers]
    head = choose_head(kernel, weights.lm_head, head)
    embed = weights.embed
    if head == "q8-i16in":
        lm_head = Q8I16InLinear(weights.lm_head)
        if weights.lm_head is weights.embed:  # tied: token lookup reads the same 8-bit numbers (q8_embedding)
            from bulkhead.model.q8_embedding import Q8Embedding

            embed = Q8Embedding(lm_head.packed)
    elif head == "bf16w":
        lm_head = BF16WeightLinear(weights.lm_head)
    else:
        lm_head = prepare_one(weights.lm_head, "onednn" if kernel in REDUCED else kernel)
    return dataclasses.replace(weights, embed=embed, layers=layers, lm_head=lm_head)
