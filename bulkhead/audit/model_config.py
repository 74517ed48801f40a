"""Read the attention layout out of a Hugging Face `config.json`.

Only the fields that size the KV cache are read. Two layouts exist here:

- MHA/GQA: every layer stores a K and a V vector per KV head.
- MLA (DeepSeek-V2/V3 style, `kv_lora_rank` set): every layer stores one
  compressed latent of `kv_lora_rank` plus a shared rope key of
  `qk_rope_head_dim`; there are no per-head K/V to split across TP ranks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from bulkhead.audit.errors import PlanInputError


@dataclass(frozen=True)
class AttentionLayout:
    """What one token costs in KV cache, before dtype and TP are applied."""

    model_type: str
    num_layers: int
    is_mla: bool
    num_attention_heads: int
    num_kv_heads: int  # GQA/MHA only; 0 for MLA, whose latent is shared by all heads
    head_dim: int  # GQA/MHA only; 0 for MLA
    kv_lora_rank: int  # MLA only; 0 otherwise
    qk_rope_head_dim: int  # MLA only; 0 otherwise
    max_position_embeddings: int | None
    config_dtype: str | None  # `torch_dtype`/`dtype` in the config; the KV dtype for `--kv-dtype auto`

    @property
    def kind(self) -> str:
        if self.is_mla:
            return "MLA"
        if self.num_kv_heads == self.num_attention_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"


def load_config(path: str | Path) -> dict[str, Any]:
    """The JSON object in `path`, or in `path/config.json` when given a directory."""
    config_path = Path(path)
    if config_path.is_dir():
        config_path = config_path / "config.json"
    try:
        data = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise PlanInputError(f"model config not found: {config_path}") from error
    except (OSError, ValueError) as error:
        raise PlanInputError(f"model config {config_path} is not readable JSON: {error}") from error
    if not isinstance(data, dict):
        raise PlanInputError(f"model config {config_path} is not a JSON object")
    return data


def attention_layout(config: Mapping[str, Any]) -> AttentionLayout:
    """The KV-relevant shape of `config`; raises PlanInputError naming a missing field."""
    # Multimodal configs nest the decoder under `text_config`.
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), Mapping):
        config = {**config["text_config"], **{k: v for k, v in config.items() if k != "text_config"}}
    num_layers = _positive_int(config, "num_hidden_layers")
    num_heads = _positive_int(config, "num_attention_heads")
    common = dict(model_type=str(config.get("model_type", "unknown")), num_layers=num_layers,
                  num_attention_heads=num_heads,
                  max_position_embeddings=_optional_positive_int(config, "max_position_embeddings"),
                  config_dtype=config.get("torch_dtype") or config.get("dtype"))
    if config.get("kv_lora_rank"):
        return AttentionLayout(is_mla=True, num_kv_heads=0, head_dim=0,
                               kv_lora_rank=_positive_int(config, "kv_lora_rank"),
                               qk_rope_head_dim=_positive_int(config, "qk_rope_head_dim"), **common)
    # MHA configs omit num_key_value_heads: every attention head has its own K/V.
    num_kv_heads = _optional_positive_int(config, "num_key_value_heads") or num_heads
    # head_dim must be read when given: GLM-4.5 has 96 heads of 128 over a
    # 5120 hidden size, so hidden_size // heads would be wrong.
    head_dim = _optional_positive_int(config, "head_dim")
    if head_dim is None:
        hidden = _positive_int(config, "hidden_size")
        if hidden % num_heads:
            raise PlanInputError(f"hidden_size {hidden} is not divisible by num_attention_heads {num_heads}; set head_dim")
        head_dim = hidden // num_heads
    return AttentionLayout(is_mla=False, num_kv_heads=num_kv_heads, head_dim=head_dim, kv_lora_rank=0,
                           qk_rope_head_dim=0, **common)


def _optional_positive_int(config: Mapping[str, Any], key: str) -> int | None:
    if config.get(key) is None:
        return None
    return _positive_int(config, key)


def _positive_int(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if value is None:
        raise PlanInputError(f"model config has no {key!r}")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PlanInputError(f"model config {key!r} must be a positive integer, got {value!r}")
    return value
