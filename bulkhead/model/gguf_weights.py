"""A GGUF file's weight tensors read as they are stored: memory-mapped by
gguf-py's GGUFReader, decoded block by block (bulkhead.model.gguf_codes),
under the Hugging Face names bulkhead's loader takes.

Why: the kernels take the stored codes with their per-group scales.
Reading them directly replaces a dequantize-to-fp32 import (transformers,
~30 s once) and a search for the grid in the fp32 values (q4_kernel.grid,
~1.2 s a start): `remember_layer_codes` hands the kernels the stored codes of
each fused weight, and the fp32 values (gguf-py's dequantize, bit for bit)
feed the exact path and the bf16 prompt kernels.

llama.cpp stores a Llama's q and k rows in its RoPE order; transformers'
GGUF import puts them back (its LlamaTensorProcessor), and so does
`rope_rows` here, for the same archs.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from bulkhead.model import format_linear, gguf_codes, i16in_kernel, q4_kernel
from bulkhead.model.gguf_codes import Decoded, Q4Codes, Q8ACodes, Q8Codes

log = logging.getLogger(__name__)

TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
BLOCK_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
               "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
               "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}
# Architectures whose q and k rows llama.cpp's converter permuted for its RoPE (transformers' TENSOR_PROCESSORS).
ROPE_PERMUTED_ARCHS = ("llama",)
# ModelWeights' fused linear layers and the Hugging Face layers each concatenates, in order (loader.build_weights).
FUSED = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
         "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}


def hf_name(gguf_name: str) -> str | None:
    """"blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"; None for a name not in the tables."""
    base, _, suffix = gguf_name.rpartition(".")
    if base in TOP_NAMES:
        return f"{TOP_NAMES[base]}.{suffix}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{BLOCK_NAMES[parts[2]]}.{suffix}"
    return None


def rope_rows(rows: int, heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation: within each head,
    its rows (pairs interleaved, [dim, 2]) become [2, dim] (first halves, then second)."""
    return torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)


def tensor_table(path: Path) -> dict:
    """{"arch": the file's architecture, "tensors": [[GGUF name, type name,
    shape (rows first), absolute byte offset, bytes], ...]}, from gguf-py's
    GGUFReader. It parses every metadata field (the tokenizer's 49k strings
    and merges: seconds of Python), so the import keeps this table beside
    the config (bulkhead.model.gguf_import.GGUF_POINTER) and starts read that."""
    import gguf

    reader = gguf.GGUFReader(path, "r")
    field = reader.fields["general.architecture"]
    return {"arch": bytes(field.parts[field.data[0]]).decode(),
            "tensors": [[t.name, t.tensor_type.name, [int(n) for n in reversed(t.shape.tolist())],
                         int(t.data_offset), int(t.n_bytes)] for t in reader.tensors]}


class GGUFFile:
    """One GGUF file's tensors by Hugging Face name, memory-mapped (nothing
    is read until decoded). `table`: tensor_table(path)'s answer, where the caller kept it."""

    def __init__(self, path: Path, table: dict | None = None):
        self.path = Path(path)
        table = table or tensor_table(self.path)
        self.arch = table["arch"]
        self.tensors = {}  # Hugging Face name -> [GGUF name, type, shape, offset, bytes]
        for entry in table["tensors"]:
            name = hf_name(entry[0])
            if name is None:
                log.warning("%s: tensor %s has no place in a Llama block; ignored", self.path.name, entry[0])
            else:
                self.tensors[name] = entry

    def formats(self) -> dict[str, str]:
        """{Hugging Face name: GGUF type name} (a tied lm_head, no output.weight, has no entry)."""
        return {name: entry[1] for name, entry in self.tensors.items()}

    def decoded(self, name: str, num_heads: int, num_kv_heads: int) -> Decoded:
        """Tensor `name` decoded as stored, its q/k rows in Hugging Face's order."""
        _, type_name, shape, offset, nbytes = self.tensors[name]
        stored = np.memmap(self.path, np.uint8, "r", offset, (nbytes,))
        stored = stored.reshape(shape[0] if len(shape) == 2 else 1, -1)  # [rows, bytes per row]
        heads = {"q_proj": num_heads, "k_proj": num_kv_heads}.get(name.split(".")[-2])
        if self.arch in ROPE_PERMUTED_ARCHS and heads is not None:  # every type's blocks lie within a row
            stored = stored[rope_rows(shape[0], heads).numpy()]
        return gguf_codes.decode(stored, type_name, tuple(shape))


def read(path: Path, num_heads: int, num_kv_heads: int, table: dict | None = None) -> dict[str, Decoded]:
    """Every tensor of the GGUF at `path`, decoded as stored, by Hugging Face name."""
    f = GGUFFile(path, table)
    fallback = gguf_codes.fallback_types(f.formats().values())
    if fallback:
        log.warning("%s: %s tensors have no decoder: dequantized to fp32 by gguf-py", f.path.name,
                    ", ".join(fallback))
    return {name: f.decoded(name, num_heads, num_kv_heads) for name in f.tensors}


def _fused(parts: list[Decoded]) -> Decoded | None:
    """The codes of a fused layer (its parts' rows one after another): of
    the parts' kind where they share one, else all as Q8ACodes (a Q4_K_M
    file's Q4_K q and k beside a Q6_K v); None where a part has no codes."""
    if all(isinstance(p, Q4Codes) for p in parts):
        return Q4Codes(*(torch.cat([getattr(p, f) for p in parts]) for f in ("q", "d", "m")))
    if all(isinstance(p, Q8Codes) for p in parts):
        return Q8Codes(*(torch.cat([getattr(p, f) for p in parts]) for f in ("q", "d")))
    if all(isinstance(p, (Q4Codes, Q8Codes, Q8ACodes)) for p in parts):
        wide = [gguf_codes.as_q8a(p) for p in parts]
        return Q8ACodes(*(torch.cat([getattr(p, f) for p in wide]) for f in ("q", "d", "m")))
    return None


def remember_layer_codes(layer, i: int, decoded: dict[str, Decoded]) -> dict[str, str]:
    """Hand the kernels the stored codes of layer i (a LayerWeights built
    from `decoded`'s values): each fused linear layer's codes of any kind
    (format_linear.codes_of: the per-format kernels), its 4-bit ones to
    q4_kernel.grid too. Returns {layer group: the kind of codes given}."""
    given = {}
    for fused, parts in FUSED.items():
        codes = _fused([decoded[f"model.layers.{i}.{p}.weight"] for p in parts])
        if codes is None:
            continue
        format_linear.remember(getattr(layer, fused), codes)
        given[fused] = type(codes).__name__.removesuffix("Codes")
        if isinstance(codes, Q4Codes):
            q4_kernel.remember_grid(getattr(layer, fused), (codes.q, codes.d, codes.m))
    return given


def remember_head_codes(weights, decoded: dict[str, Decoded]) -> dict[str, str]:
    """The lm_head's 8-bit codes (a Q8_0 tensor) for i16in_kernel.q8_grid."""
    head = decoded.get("lm_head.weight", decoded.get("model.embed_tokens.weight"))
    w = weights.lm_head
    if isinstance(head, Q8Codes) and w.dtype == torch.float32 and q4_kernel.fits(w):
        i16in_kernel.remember_q8_grid(w, (head.q, head.d))
        return {"lm_head": "Q8"}
    return {}
