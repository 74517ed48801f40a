"""A validated adapter's deltas as tensors, fused the way the model fuses its linears.

The model runs q, k and v as one matmul (LayerWeights.qkv) and gate and up
as one (gate_up), so an adapter's deltas are fused the same way: for each
layer and each fused linear, A [R, in] stacks the targeted modules' lora_A
rows (one matmul for all of them: they share the input), and each module's
scaled lora_B [out_m, r] adds `u[:, its r columns] @ B_m.T` to its own
columns of the fused output:

    u = x @ A.T;  y[:, cols_m] += u[:, rank_m] @ B_m.T

No zero blocks are held, so an adapter costs exactly its own numbers
(bulkhead.lora.peft_files.fp32_bytes). Values are fp32, whatever the
file stored (bf16 and fp16 widen exactly).

The values come from the very bytes whose header and digest were checked
(bulkhead.lora.peft_files.read_adapter with `data`): a file swapped after
validation cannot slip in. Non-finite values are refused (AdapterRefused).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from safetensors.torch import load as load_safetensors

from bulkhead.lora.peft_files import FUSED, WEIGHTS_FILE, AdapterFiles, AdapterRefused
from bulkhead.model.config import ModelConfig


@dataclass(frozen=True)
class ModuleB:
    cols: tuple[int, int]  # the module's columns [start, stop) of the fused output
    ranks: tuple[int, int]  # its columns [start, stop) of u = x @ A.T
    b: torch.Tensor  # [out_m, r] fp32, scaling folded in


@dataclass(frozen=True)
class FusedDelta:
    a: torch.Tensor  # [R, in] fp32: the targeted modules' lora_A stacked
    parts: tuple[ModuleB, ...]


@dataclass(frozen=True)
class LoraWeights:
    digest: str
    layers: tuple[dict[str, FusedDelta], ...]  # per layer: fused linear name -> its delta (absent: none)
    nbytes: int  # the fp32 tensors held
    # False: only `packed` is held, the tensors above are shapes on torch's
    # meta device (bulkhead.model.lora_layers.pack_only; the fp32 path refuses them).
    fp32: bool = True
    # bulkhead.model.lora_layers.packed's bf16 copy for the C decode layers, made
    # on first use there (at most one entry); dropped with these weights.
    packed: list = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def load(cls, files: AdapterFiles, config: ModelConfig, data: bytes) -> LoraWeights:
        """The deltas of an adapter validated from `data` (read_adapter(..., data=data))."""
        tensors = load_safetensors(data)
        deltas: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        for name, (layer, module, side) in files.tensors.items():
            t = tensors[name].float()
            if not torch.isfinite(t).all():
                raise AdapterRefused(f"{files.path / WEIGHTS_FILE}: tensor {name!r} holds a NaN or an infinity")
            a, b = deltas.get((layer, module), (None, None))
            deltas[(layer, module)] = (t, b) if side == "A" else (a, t * files.scaling)
        layers = tuple(_fuse(deltas, layer, config) for layer in range(config.num_layers))
        nbytes = sum(d.a.nbytes + sum(p.b.nbytes for p in d.parts) for fused in layers for d in fused.values())
        return cls(files.digest, layers, nbytes)


def _fuse(deltas, layer: int, config: ModelConfig) -> dict[str, FusedDelta]:
    widths = {"q_proj": config.q_size, "k_proj": config.kv_size, "v_proj": config.kv_size,
              "o_proj": config.hidden_size, "gate_proj": config.intermediate_size,
              "up_proj": config.intermediate_size, "down_proj": config.hidden_size}
    fused = {}
    for name, modules in FUSED.items():
        present = [m for m in modules if (layer, m) in deltas]
        if not present:
            continue
        a = torch.cat([deltas[(layer, m)][0] for m in present])
        parts, col, rank = [], 0, 0
        for m in modules:
            if m in present:
                b = deltas[(layer, m)][1]
                parts.append(ModuleB((col, col + widths[m]), (rank, rank + b.shape[1]), b.contiguous()))
                rank += b.shape[1]
            col += widths[m]
        fused[name] = FusedDelta(a.contiguous(), tuple(parts))
    return fused
