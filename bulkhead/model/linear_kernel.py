"""Which kernel runs the linear layers, and the weights laid out for it.

The choice is bulkhead.model.kernel_table's (`choose`, `choose_head`);
`runs` says whether a row's kernels run here for these weights (their C
library builds, the weights pack exactly); the layer classes below hold each
kernel's packing. What each computes in: kernel_names.MATMUL_PRECISION
(/server_info) and docs/performance.md "Kernel flags" and "Quality".

The exact fp32 path (`--precision exact`) is oneDNN over a weight laid out
for it once (`onednn`), else aten's F.linear (`aten`). Why oneDNN: on this
project's 2-core AMD EPYC machine MKL's sgemm runs the model's linear layers
3.7x slower at 4 rows than oneDNN over a weight laid out ahead of time,
which is also what vLLM's CPU build runs.

Every kernel's outputs are fp32, and so are the lm_head's inputs, sums and
logits whatever its weights: bf16 keeps 8 bits of a logit, steps of 0.125
at 20, and with a bf16 GEMM lm_head (oneDNN's, which rounds output and
inputs) the README's question was answered in French (fp32 puts "The" 0.08
nats above "L"). Batch invariance is not assumed of any kernel: the engine
measures it at start-up (bulkhead.model.row_invariance); a request's decode
rows always take the decode kernel, so the choice never depends on
batch-mates.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.nn.functional as F

from bulkhead.model import bf16in_kernel, c_linear, format_linear, head_linear, i16in_kernel, kernel_table, q4_kernel, \
    q4_scales
from bulkhead.model.bf16_embedding import BF16Embedding
from bulkhead.model.gguf_codes import Q4Codes
from bulkhead.model.head_linear import (  # noqa: F401  (re-exported)
    BF16InputHead, BF16WeightLinear, Q8I16InLinear, choose_head,
)
from bulkhead.model.kernel_names import (  # noqa: F401  (torch-free: the command line reads them too)
    BF16_INPUT_PROMPTS, EXACT_KERNELS, HEAD_KERNELS, HEAD_PRECISION, KERNELS, MATMUL_PRECISION,
    Q4_KERNELS, REDUCED, ROW_BY_ROW_HEADS, RUNS,
)
from bulkhead.model.linear import Linear

log = logging.getLogger(__name__)

# The row count oneDNN lays a weight out for; any count runs on it. Measured
# here with the check of bulkhead.model.row_invariance over the model's
# shapes, hints 1, 4 and 16 all give R = 2 (a 1-row result differs from the
# same row in a bigger batch); 16 is the decode batch this is tuned for.
ROWS_HINT = 16


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


class Q4Linear(Linear):
    """`q4`'s layer: decode rows through linear_q4 (fp32 inputs and sums over
    q4_kernel.pack_grid's layout, `packed`, which the C decode layers pass it
    too), other rows through `prefill` (oneDNN fp32 over the same weight).
    `q4-i16in`'s layers are format_linear.CodedLinear over the 4-bit codes."""

    decode_inputs = "fp32"  # decode_layers refuses layers that mix decode kernels

    def __init__(self, packed: tuple[torch.Tensor, torch.Tensor], prefill: Linear):
        qs = packed[0]  # [N / NB, K, NB / 2]
        if qs.shape[2] != q4_kernel.BLOCK // 2:
            raise ValueError("the fp32-input 4-bit kernel reads q4_kernel.pack_grid's layout, not q4_scales.pack's")
        self.packed, self.prefill = packed, prefill
        self.out_features, self.in_features = qs.shape[0] * q4_kernel.BLOCK, qs.shape[1]

    def decode_fn(self):
        """linear_q4 (the C decode layers call it too), or None where its library cannot be loaded here."""
        lib = q4_kernel.load()
        return None if lib is None else lib.linear_q4

    def __call__(self, x, b=None, decode=False):
        if not decode:
            return self.prefill(x, b)
        fn = c_linear.needed(q4_kernel.load(), "the 4-bit decode kernel").linear_q4
        y = c_linear.call(fn, x.float(), self.in_features, self.out_features, *self.packed)
        return (y if b is None else y + b.float()).to(x.dtype)


class BF16InLinear(Linear):
    """Prompt rows through bf16 weights and inputs, fp32 sums and outputs
    (bf16in_kernel); `wb` the packed weight. Rows already bf16 (silu_mul's)
    are read as they are, with float32 out."""

    def __init__(self, wb: torch.Tensor):
        self.wb = wb
        self.out_features, self.in_features = wb.shape[0] * bf16in_kernel.BLOCK, wb.shape[1] * 2

    def __call__(self, x, b=None, decode=False):
        rounded = x.dtype == torch.bfloat16
        y = bf16in_kernel.linear_bf16in(x if rounded else x.float(), self.wb)
        y = y if b is None else y + b.float()
        return y if rounded else y.to(x.dtype)

    def silu_mul(self, x):
        if not bf16in_kernel.silu_mul_fits(self.wb):
            return None
        return bf16in_kernel.linear_bf16in_silu_mul(x.float(), self.wb)


class BF16Linear(Linear):
    """A bf16 checkpoint's layer (`bf16`): its weights held once, as stored,
    prompt rows through BF16InLinear, decode rows through
    bf16in_kernel.linear_bf16_bf16in (each row's numbers the prompt kernel's)."""

    decode_inputs = "bf16"  # decode_layers refuses layers that mix decode kernels

    def __init__(self, prefill: BF16InLinear):
        self.prefill = prefill
        self.packed = (prefill.wb, bf16in_kernel.NO_SECOND_WEIGHT)  # the C decode layers' two weight pointers
        self.out_features, self.in_features = prefill.out_features, prefill.in_features

    def decode_fn(self):
        """The C function decode rows run (linear_q4's signature), or None where it cannot be loaded."""
        lib = bf16in_kernel.load()
        return None if lib is None else lib.linear_bf16_bf16in

    def __call__(self, x, b=None, decode=False):
        if not decode:
            return self.prefill(x, b)
        y = bf16in_kernel.linear_bf16_bf16in(x.float(), self.prefill.wb)
        return (y if b is None else y + b.float()).to(x.dtype)

    def silu_mul(self, x):
        return self.prefill.silu_mul(x)


def bf16_usable(weights, dtype: torch.dtype) -> bool:
    """The bf16 kernels build here and every linear weight is held as a
    16-bit checkpoint stored it (bf16, or fp16 that packing rounds to bf16
    once) or is an fp32 bf16 value, in a shape they take."""
    if dtype != torch.float32 or bf16in_kernel.load() is None or weights is None:
        return False
    return all(bf16in_kernel.fits(w) and (w.dtype in HELD_AS_STORED or torch.equal(w.bfloat16().float(), w))
               for w in format_linear.linears(weights))


def q4_usable(weights) -> bool:
    """The 4-bit kernel builds here and every linear weight it would take
    lies exactly on a 4-bit grid (q4_kernel.grid)."""
    if q4_kernel.load() is None or weights is None:
        return False
    return all(q4_kernel.grid(w) is not None for w in format_linear.linears(weights))


def onednn_usable(dtype: torch.dtype) -> bool:
    """This torch build has oneDNN and it runs a reordered linear of this dtype."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        y = OneDNNLinear(torch.ones(8, 8), dtype)(torch.ones(2, 8))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return bool(torch.all(y == 8))


def layer_format(weights, stored: str | None) -> str:
    """The format the table looks the linear layers up by: `stored`
    (weight_format.linear_format) for a bf16 or fp16 checkpoint; a 4-bit
    grid format where every weight rebuilds exactly from one (q4_kernel.grid:
    also an import that recorded no format); else `stored`, or "F32"."""
    if stored in ("BF16", "F16"):
        return stored
    if weights is not None and q4_usable(weights):
        return stored if stored in kernel_table.GRID_4BIT else "Q4_1"
    return stored or "F32"


def runs(kernel: str, dtype: torch.dtype, weights) -> bool:
    """This linear kernel runs here on these weights: its C kernels build
    (with the CPU features they need), --dtype is float32 where they need it,
    and the weights are in the format they read. The 4-bit ones keep oneDNN
    for an fp32 lm_head where bf16w cannot run."""
    fp32 = dtype == torch.float32
    if kernel == "q4-i16in":
        return fp32 and i16in_kernel.load() is not None and bf16in_kernel.load() is not None \
            and runs("q4", dtype, weights)
    if kernel == "q4":
        return fp32 and onednn_usable(dtype) and weights is not None and q4_usable(weights)
    if kernel == "bf16":
        return bf16_usable(weights, dtype)
    if kernel == "gguf-i16in":
        return fp32 and i16in_kernel.load() is not None and bf16in_kernel.load() is not None \
            and format_linear.all_coded(weights)
    if kernel == "onednn":
        return onednn_usable(dtype)
    return kernel == "aten"


# Why a developer's --linear-kernel cannot run here, by kernel.
_REFUSED = {"q4": "its C kernel cannot be built here, --dtype is not float32",
            "q4-i16in": "this CPU has no AVX-512 BF16 or no AVX-512 VNNI, --dtype is not float32",
            "bf16": "its C kernel cannot be built here (no AVX-512 BF16), --dtype is not float32",
            "gguf-i16in": "this CPU has no AVX-512 BF16 or no AVX-512 VNNI, --dtype is not float32",
            "onednn": "this torch build cannot run oneDNN linear layers"}
_WEIGHTS = {"bf16": "a linear weight is not a bf16 value",
            "gguf-i16in": "a linear weight was not read from a GGUF file's codes"}


def choose(kernel: str, dtype: torch.dtype, weights=None, stored: str | None = None) -> str:
    """Resolve "auto" by the kernel table (the first row for these weights'
    format and this CPU whose kernels run here) and "exact" to the exact
    fp32 path; check a developer's named kernel runs here, else refuse it."""
    if kernel not in KERNELS:
        raise ValueError(f"linear kernel must be one of {KERNELS}, not {kernel!r}")
    if kernel == "auto" and stored is None and _per_group(dtype, weights):
        log.info("linear weights stored in several formats (%s): each group on its own format's kernel",
                 ", ".join(sorted(format_linear.group_formats(weights))))
        return "gguf-i16in"
    if kernel == "auto":
        fmt = layer_format(weights, stored)
        for row in kernel_table.rows_for(fmt, kernel_table.cpu_features()):
            if row is not kernel_table.EXACT and runs(row.linear, dtype, weights):
                log.info("linear weights stored as %s: prompts %s, decode rows %s", fmt, row.prompt, row.decode)
                return row.linear
        kernel = "exact"
    if kernel == "exact":
        if onednn_usable(dtype):
            return "onednn"
        log.info("oneDNN linear layers unavailable in this torch build; using F.linear")
        return "aten"
    if runs(kernel, dtype, weights):
        return kernel
    raise RuntimeError(f"--linear-kernel {kernel}: {_REFUSED[kernel]}, or "
                       + _WEIGHTS.get(kernel, "a linear weight is not exactly on a 4-bit grid (a Q4_0 / Q4_1 model)"))


def _per_group(dtype: torch.dtype, weights) -> bool:
    """A GGUF file whose linear groups differ in format (stored None), not
    all on the 4-bit grid, each group's format with a 16-bit-input row in
    the table (kernel_table.per_group) and gguf-i16in runs here."""
    if not format_linear.all_coded(weights) or format_linear.decode_kernels(weights) == {"q4-i16in"}:
        return False
    return kernel_table.per_group(format_linear.group_formats(weights), kernel_table.cpu_features()) \
        and runs("gguf-i16in", dtype, weights)


def prepare_one(w: torch.Tensor, kernel: str, runs: str = "both") -> Linear:
    """One [out, in] weight laid out for a chosen kernel, for the passes
    `runs` names (kernel_names.RUNS): a prefill worker's 4-bit layers keep
    only the prompt kernel's bf16 packing, a decode worker's only the 4-bit
    one (CodedLinear runs its prompt rows then). Kernels with one packing for
    both (bf16, the exact ones) lay it out whatever `runs`."""
    if runs not in RUNS:
        raise ValueError(f"runs must be one of {RUNS}, not {runs!r}")
    if kernel == "aten":
        return AtenLinear(w)
    if kernel == "onednn":
        return OneDNNLinear(w, w.dtype)
    if kernel == "bf16":
        return BF16Linear(BF16InLinear(bf16in_kernel.pack(w)))
    if kernel == "gguf-i16in":
        return format_linear.prepare_one(w, runs)
    if kernel in Q4_KERNELS:
        if kernel == "q4-i16in" and runs == "prompts":  # never a decode row: no 4-bit packing
            return BF16InLinear(bf16in_kernel.pack(w))
        found = q4_kernel.grid(w)
        if found is None:
            raise ValueError(f"{kernel}: weight {tuple(w.shape)} is not exactly on a 4-bit grid (see choose())")
        if kernel == "q4":
            return Q4Linear(q4_kernel.pack_grid(*found), OneDNNLinear(w, w.dtype))
        # No fp32 copy of the weight: prompts read it in bf16, a decode worker's (runs "decode") the codes.
        prompts = None if runs == "decode" else BF16InLinear(bf16in_kernel.pack(w))
        return format_linear.CodedLinear(Q4Codes(*found), prompts)
    raise ValueError(f"prepare_one() takes a chosen kernel, not {kernel!r} (see choose())")


def prepare(weights, kernel: str, head: str | None = None, release: bool = False, runs: str = "both"):
    """A new ModelWeights with every linear layer laid out for `kernel`, the
    lm_head for `head` (choose_head's answer when None). A tied embedding
    stays for token lookup, except under a `q8-i16in` or `bf16-in` lm_head,
    whose packing holds the same numbers (q8_embedding, bf16_embedding). A
    16-bit matrix the loader kept as stored (loader.held_as_stored) is
    widened, one at a time, for every kernel but `bf16`. release=True
    empties `weights.layers` as each is laid out, so that the plain and the
    laid-out weights are never both held whole; otherwise the input is not
    changed. runs: the passes the engine runs (prepare_one)."""
    dtype = weights.final_norm.dtype  # the model's (the loader gives norms its dtype)
    layers = []
    for i in range(len(weights.layers)):  # by index: an iterator would hold the last layer while the next is made
        layer = weights.layers[i]
        layers.append(dataclasses.replace(layer, **{name: prepare_one(_widened(getattr(layer, name), kernel, dtype),
                                                                      kernel, runs) for name in LINEARS}))
        del layer  # a GGUF's plain layer (loader.GGUFLayers) goes before the next is decoded
        if release:
            weights.layers[i] = None
    lm_head = _widened(weights.lm_head, kernel, dtype)
    head = choose_head(kernel, lm_head, head)
    embed, tied = weights.embed, weights.lm_head is weights.embed
    if head in head_linear.LAYERS:
        lm_head = head_linear.LAYERS[head](lm_head)
    else:
        lm_head = prepare_one(weights.lm_head.to(dtype), "onednn" if kernel in REDUCED else kernel)
    if tied and head == "q8-i16in":  # token lookup reads the same 8-bit numbers (q8_embedding)
        from bulkhead.model.q8_embedding import Q8Embedding

        embed = Q8Embedding(lm_head.packed)
    elif tied and head == "bf16-in":  # token lookup reads the same bf16 pairs
        embed = BF16Embedding(pairs=lm_head.packed)
    if embed is weights.embed and embed.dtype != dtype:  # a bf16 checkpoint's, held as stored: fp32 rows on lookup
        embed = BF16Embedding(rows=embed.clone())  # a copy of its own: the file's mapping goes
    return dataclasses.replace(weights, embed=embed, layers=layers, lm_head=lm_head)


LINEARS = ("qkv", "o", "gate_up", "down")  # LayerWeights' linear layers
# The dtypes a 16-bit checkpoint's matrices are held in as stored (loader.held_as_stored).
HELD_AS_STORED = (torch.bfloat16, torch.float16)


def _widened(w: torch.Tensor, kernel: str, dtype: torch.dtype) -> torch.Tensor:
    """w in the model's dtype, but as stored for the bf16 kernels, whose packing rounds it to bf16."""
    return w if kernel == "bf16" else w.to(dtype)
