"""Linear layers that run each tensor group's own stored format
(`--linear-kernel gguf-i16in`): a GGUF file whose groups are stored in
different formats (a Q4_K_M file holds Q4_K, Q6_K, and, where a row is not
whole super-blocks, Q5_0, Q5_1 and Q8_0) runs every group on its format's
kernel (kernel_table's row for that format), not the whole model on the
exact fp32 path.

Decode rows: inputs as 16-bit integers per group of 32 and the stored
codes read once, exact int32 sums (csrc/linear_i16in.h, csrc/linear_q8a.h):
Q4Codes through q4-i16in (q4_scales' layouts), Q8Codes (Q8_0, Q5_0: a
5-bit kernel lost to the 8-bit one on the same codes, docs/performance.md)
through q8-i16in, Q8ACodes (Q6_K, Q5_K, Q5_1, a fused layer of mixed
formats) through q8a-i16in. The C decode layers call one function for
every matmul, so each layer hands them `linear_coded` and a descriptor (its
format's tag and its two tensors): csrc/linear.c dispatches. Prompt rows:
bf16 inputs and weights, fp32 sums (bf16in_kernel), as q4-i16in's.

The codes come from the GGUF read (gguf_weights.remember_layer_codes); a weight
without them has no kernel here, and the model runs the exact path.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from bulkhead.model import bf16in_kernel, c_linear, i16in_kernel, q4_kernel, q4_scales
from bulkhead.model.gguf_codes import Q4Codes, Q8ACodes, Q8Codes
from bulkhead.model.linear import Linear

# csrc/linear.c's CODED_* tags, by decode kernel (kernel_table's names).
TAGS = {"q4-i16in": 0, "q8-i16in": 1, "q8a-i16in": 2}

# A GGUF type each decode kernel stands for in kernel_table's rows.
TABLE_FORMATS = {"q4-i16in": "Q4_K", "q8-i16in": "Q8_0", "q8a-i16in": "Q6_K"}

# A fused weight's stored codes, while it lives (gguf_weights.remember_layer_codes).
_CODES = WeakIdKeyDictionary()


def remember(w: torch.Tensor, codes) -> None:
    """Record the stored codes of weight `w` (its values, fused as the model holds them)."""
    if w.dtype == torch.float32 and q4_kernel.fits(w):  # the kernels' shape: outputs in 32s, inputs in 32s
        _CODES[w] = codes


def codes_of(w: torch.Tensor):
    return _CODES.get(w)


def linears(weights) -> list[torch.Tensor]:
    return [w for layer in weights.layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down)]


def all_coded(weights) -> bool:
    """Every linear weight of `weights` has its stored codes recorded."""
    return weights is not None and all(codes_of(w) is not None for w in linears(weights))


def decode_kernels(weights) -> set[str]:
    """The decode kernels the model's groups take ({"q8-i16in", "q8a-i16in", ...})."""
    return {kernel_of(codes_of(w)) for w in linears(weights)}


def kernel_of(codes) -> str:
    """The decode kernel of `codes` (the table at the top)."""
    return {Q4Codes: "q4-i16in", Q8Codes: "q8-i16in"}.get(type(codes), "q8a-i16in")


def group_formats(weights) -> set[str]:
    """The formats kernel_table looks the model's groups up by (TABLE_FORMATS)."""
    return {TABLE_FORMATS[kernel] for kernel in decode_kernels(weights)}


def pack_q8a(codes: Q8ACodes) -> tuple[torch.Tensor, torch.Tensor]:
    """(qb as i16in_kernel.pack_q8_grid lays it out, dm fp32 [N/NB, K/G, 3, NB]:
    per group the low half's scale, the high half's, the offset)."""
    n, groups = codes.q.shape[:2]
    nb = q4_kernel.BLOCK
    qb, _ = i16in_kernel.pack_q8_grid(codes.q, codes.m)
    d = codes.d.reshape(n // nb, nb, groups, 2)
    m = codes.m.reshape(n // nb, nb, groups, 1)
    return qb, torch.cat([d, m], -1).permute(0, 2, 3, 1).contiguous()


def pack(codes) -> tuple[torch.Tensor, torch.Tensor]:
    """The two tensors of `codes`' decode kernel (kernel_of's)."""
    kernel = kernel_of(codes)
    if kernel == "q4-i16in":
        return q4_scales.pack(codes.q, codes.d, codes.m)
    if kernel == "q8-i16in":
        return i16in_kernel.pack_q8_grid(codes.q, codes.d)
    return pack_q8a(codes)


class CodedLinear(Linear):
    """Decode rows through the layer's own format's kernel (the table at
    the top), by way of linear_coded; prompt rows through `prefill`, or,
    where it is None (a decode worker's layout, kernel_names.RUNS
    "decode"), through the same decode kernel: the worker then holds no bf16
    copy of the weights (1,856 MiB of a 1B model), and runs prompts only to
    recompute a request it preempted, each row alone, at 1.0-1.6x the bf16
    prompt kernel's time at 64 and 256 rows (bench/prompt_kernels.py)."""

    decode_inputs = "i16"

    def __init__(self, codes, prefill: Linear | None):
        self._bind(kernel_of(codes), pack(codes), prefill)

    @classmethod
    def from_packed(cls, kernel: str, weights: tuple[torch.Tensor, torch.Tensor],
                    prefill: Linear | None) -> CodedLinear:
        """The layer over pack()'s answer for decode kernel `kernel`, as an
        earlier start cached it (bulkhead.model.prepared_weights)."""
        if kernel not in TAGS:
            raise ValueError(f"a coded layer's decode kernel is one of {tuple(TAGS)}, not {kernel!r}")
        layer = cls.__new__(cls)
        layer._bind(kernel, weights, prefill)
        return layer

    def _bind(self, kernel: str, weights: tuple[torch.Tensor, torch.Tensor], prefill: Linear | None) -> None:
        self.format, self.weights, self.prefill = kernel, weights, prefill
        # [tag, codes, scales]: linear_coded's descriptor; the C decode layers pass it as the weight pointer.
        self.desc = q4_scales.descriptor(weights) if kernel == "q4-i16in" else \
            torch.tensor([TAGS[kernel], *(t.data_ptr() for t in weights)], dtype=torch.int64)
        self.packed = (self.desc, self.desc)
        qb = weights[0]  # q8 and q8a: [N/NB, K/2, 2, NB/2, 2] int8 (i16in_kernel.pack_q8_grid)
        self.out_features, self.in_features = q4_scales.shape_of(weights) if kernel == "q4-i16in" else \
            (qb.shape[0] * q4_kernel.BLOCK, qb.shape[1] * 2)

    def decode_fn(self):
        """linear_coded (linear_q4's signature), or None where it cannot be loaded here."""
        lib = i16in_kernel.load()
        return None if lib is None else lib.linear_coded

    def __call__(self, x, b=None, decode=False):
        if not decode and self.prefill is not None:
            return self.prefill(x, b)
        fn = self.decode_fn()
        if fn is None:
            raise RuntimeError("the 16-bit-input decode kernels are not available here")
        y = c_linear.call(fn, x.float(), self.in_features, self.out_features, self.desc, self.desc)
        return (y if b is None else y + b.float()).to(x.dtype)

    def silu_mul(self, x):
        return None if self.prefill is None else self.prefill.silu_mul(x)


def prepare_one(w: torch.Tensor, runs: str = "both") -> Linear:
    """Weight `w` (fp32 values whose codes were recorded) laid out for its
    format's kernels, for the passes `runs` names (kernel_names.RUNS): a
    prefill worker's holds the bf16 prompt packing only, a decode worker's
    the stored codes only."""
    from bulkhead.model.linear_kernel import BF16InLinear

    if runs == "prompts":
        return BF16InLinear(bf16in_kernel.pack(w))
    codes = codes_of(w)
    if codes is None:
        raise ValueError(f"gguf-i16in: weight {tuple(w.shape)} has no stored codes (a GGUF file's; see choose())")
    return CodedLinear(codes, None if runs == "decode" else BF16InLinear(bf16in_kernel.pack(w)))


# The GGUF types whose codes each decode kernel reads as stored (gguf_codes'
# decoders; gguf_weights._fused puts a fused layer of mixed kinds on q8a).
TYPES_OF = {"q4-i16in": ("Q4_0", "Q4_1", "Q4_K"), "q8-i16in": ("Q8_0", "Q5_0"),
            "q8a-i16in": ("Q6_K", "Q5_K", "Q5_1")}


def kernel_of_types(types) -> str | None:
    """The decode kernel of a fused layer whose parts are stored as `types`
    (GGUF type names): what kernel_of gives for its codes, from the file's
    table alone (/server_info); None where a part has no codes."""
    kinds = {next((k for k, names in TYPES_OF.items() if t in names), None) for t in types}
    if not kinds or None in kinds:
        return None
    return kinds.pop() if len(kinds) == 1 else "q8a-i16in"
