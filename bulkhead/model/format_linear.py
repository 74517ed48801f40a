"""Linear layers that run each tensor group's own stored format
(`--linear-kernel gguf-i16in`): a GGUF file whose groups are stored in
different formats (a Q4_K_M file holds Q4_K, Q6_K, and, where a row is not
whole super-blocks, Q5_0, Q5_1 and Q8_0) runs every group on its format's
kernel (kernel_table's row for that format), not the whole model on the
exact fp32 path.

Decode rows: inputs as 16-bit integers per group of 32 and the stored
codes read once, exact int32 sums (csrc/linear_i16in.h, csrc/linear_q8a.h):

| codes (gguf_codes) | stored as | decode kernel | bytes a weight read |
|---|---|---|---|
| Q4Codes | Q4_0, Q4_1, Q4_K | linear_q4_i16in | 0.75 |
| Q8Codes with q in -16..15 | Q5_0 | linear_q5_i16in (q + 16, m = -16 d) | 0.875 |
| Q8ACodes with q in 0..31, one scale per 32 | Q5_1, Q5_K | linear_q5_i16in | 0.875 |
| Q8Codes | Q8_0 | linear_q8_i16in | 1.125 |
| Q8ACodes | Q6_K, a fused layer of mixed formats | linear_q8a_i16in | 1.375 |

`kernel_of` reads which from the codes themselves (a Q8_0 tensor whose
codes happen to lie in -16..15 is as exact on the 5-bit kernel).

The C decode layers call one function for every matmul, so each layer
hands them `linear_coded` and a descriptor (its format's tag and its two
tensors): csrc/linear.c dispatches. Prompt rows: bf16 inputs and weights
(the values rounded to bf16), fp32 sums (bf16in_kernel), as q4-i16in's
prompts; the quality gate (bench/quality_gate.py, q4_k_m) bounds both.

The codes come from the GGUF read (gguf_weights.remember_codes); a weight
without them has no kernel here, and the model runs the exact path.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from bulkhead.model import bf16in_kernel, c_linear, i16in_kernel, q4_kernel
from bulkhead.model.gguf_codes import Q4Codes, Q8ACodes, Q8Codes
from bulkhead.model.linear import Linear

# csrc/linear.c's CODED_* tags, by decode kernel (kernel_table's names).
TAGS = {"q4-i16in": 0, "q8-i16in": 1, "q8a-i16in": 2, "q5-i16in": 3}

# A GGUF type each decode kernel stands for in kernel_table's rows.
TABLE_FORMATS = {"q4-i16in": "Q4_K", "q5-i16in": "Q5_0", "q8-i16in": "Q8_0", "q8a-i16in": "Q6_K"}

# A fused weight's stored codes, while it lives (gguf_weights.remember_codes).
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


def _five_bit(codes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """codes as (q uint8 0..31, d, m) per group of 32, w = q * d + m exactly, where they are 5-bit."""
    if isinstance(codes, Q8Codes) and int(codes.q.min()) >= -16 and int(codes.q.max()) <= 15:
        return (codes.q + 16).to(torch.uint8), codes.d, -16 * codes.d  # d * (q - 16): -16 d exact
    if isinstance(codes, Q8ACodes) and int(codes.q.min()) >= 0 and int(codes.q.max()) <= 31 \
            and torch.equal(codes.d[:, 0::2], codes.d[:, 1::2]):
        return codes.q.to(torch.uint8), codes.d[:, 0::2], codes.m
    return None


def kernel_of(codes) -> str:
    """The decode kernel that reads `codes` in the fewest bytes, exactly."""
    if isinstance(codes, Q4Codes):
        return "q4-i16in"
    if _five_bit(codes) is not None:
        return "q5-i16in"
    return "q8-i16in" if isinstance(codes, Q8Codes) else "q8a-i16in"


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


def pack_q5(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(per block of NB outputs linear_q4's nibbles [K, NB/2] then the fifth bits [K/2, 2] uint32 (word h
    of pair p: bit 16 i + j is output 16 h + j's of input 2 p + i), as bytes; dm as linear_q4's):
    csrc/linear_q5.h's layout."""
    n, k = q.shape[0], q.shape[1] * q.shape[2]
    nb = q4_kernel.BLOCK
    qs, dm = q4_kernel.pack_grid(q & 15, d, m)  # [N/NB, K, NB/2]
    high = (q >> 4).reshape(n // nb, nb, k // 2, 2).permute(0, 2, 1, 3).to(torch.int64)  # [N/NB, K/2, NB, 2]
    high = high.reshape(n // nb, k // 2, 2, nb // 2, 2).transpose(3, 4)  # [blocks, pairs, half, input, j]
    words = (high.reshape(n // nb, k // 2, 2, nb) << torch.arange(nb, dtype=torch.int64)).sum(-1)  # bit 16 i + j
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    return torch.cat([qs.reshape(n // nb, -1), words.view(torch.uint8).reshape(n // nb, -1)], 1).contiguous(), dm


def pack(codes) -> tuple[torch.Tensor, torch.Tensor]:
    """The two tensors of `codes`' decode kernel (kernel_of's)."""
    kernel = kernel_of(codes)
    if kernel == "q4-i16in":
        return q4_kernel.pack_grid(codes.q, codes.d, codes.m)
    if kernel == "q5-i16in":
        return pack_q5(*_five_bit(codes))
    if kernel == "q8-i16in":
        return i16in_kernel.pack_q8_grid(codes.q, codes.d)
    return pack_q8a(codes)


class CodedLinear(Linear):
    """Decode rows through the layer's own format's kernel (the table at
    the top), by way of linear_coded; prompt rows through `prefill`."""

    decode_inputs = "i16"

    def __init__(self, codes, prefill: Linear):
        self.format = kernel_of(codes)
        self.weights = pack(codes)
        # [tag, codes, scales]: linear_coded's descriptor; the C decode layers pass it as the weight pointer.
        self.desc = torch.tensor([TAGS[self.format], *(t.data_ptr() for t in self.weights)], dtype=torch.int64)
        self.packed = (self.desc, self.desc)
        self.prefill = prefill
        self.out_features, self.in_features = prefill.out_features, prefill.in_features

    def decode_fn(self):
        """linear_coded (linear_q4's signature), or None where it cannot be loaded here."""
        lib = i16in_kernel.load()
        return None if lib is None else lib.linear_coded

    def __call__(self, x, b=None, decode=False):
        if not decode:
            return self.prefill(x, b)
        fn = self.decode_fn()
        if fn is None:
            raise RuntimeError("the 16-bit-input decode kernels are not available here")
        y = c_linear.call(fn, x.float(), self.in_features, self.out_features, self.desc, self.desc)
        return (y if b is None else y + b.float()).to(x.dtype)

    def silu_mul(self, x):
        return self.prefill.silu_mul(x)


def prepare_one(w: torch.Tensor) -> CodedLinear:
    """Weight `w` (fp32 values whose codes were recorded) laid out for its format's kernels."""
    from bulkhead.model.linear_kernel import BF16InLinear

    codes = codes_of(w)
    if codes is None:
        raise ValueError(f"gguf-i16in: weight {tuple(w.shape)} has no stored codes (a GGUF file's; see choose())")
    return CodedLinear(codes, BF16InLinear(bf16in_kernel.pack(w)))
