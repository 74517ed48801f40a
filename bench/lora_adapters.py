"""Write PEFT LoRA directories (adapter_config.json and adapter_model.safetensors
in PEFT's own names), made here: nothing is downloaded. The tests and bench/lora.py use them."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from bulkhead.lora.peft_files import MODULES, BaseShapes

TINY = BaseShapes(2, {"q_proj": (8, 16), "k_proj": (4, 16), "v_proj": (4, 16), "o_proj": (16, 8),
                      "gate_proj": (32, 16), "up_proj": (32, 16), "down_proj": (16, 32)})


def write_adapter(path: Path, base: BaseShapes = TINY, rank: int = 4, alpha: float = 8.0,
                  targets: tuple[str, ...] = tuple(MODULES), seed: int = 0, scale: float = 0.05,
                  dtype: torch.dtype = torch.float32, config: dict | None = None) -> Path:
    """A random adapter on every layer's `targets`; `config` entries override adapter_config.json's."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(base.num_layers):
        for module in targets:
            out_f, in_f = base.linears[module]
            prefix = f"base_model.model.model.layers.{layer}.{MODULES[module]}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (torch.randn(rank, in_f, generator=g) * scale).to(dtype)
            tensors[f"{prefix}.lora_B.weight"] = (torch.randn(out_f, rank, generator=g) * scale).to(dtype)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(targets),
           "bias": "none", "lora_dropout": 0.0, "task_type": "CAUSAL_LM"}
    cfg.update(config or {})
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    return path
