"""The model hyper-parameters bulkhead needs, read from a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Architectures with the Llama block layout (RMSNorm, RoPE, GQA, SwiGLU).
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


class UnsupportedModel(ValueError):
    pass


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    # "default", "linear" or "llama3"; others are refused at load rather than
    # silently producing a model with the wrong positions.
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    tie_word_embeddings: bool
    # Qwen2 carries biases on q/k/v; Llama may (attention_bias).
    qkv_bias: bool
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModel(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def _rope_from(raw: dict) -> RopeConfig:
    # transformers 5 writes `rope_parameters`; older configs `rope_theta` + `rope_scaling`.
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind not in ("default", "linear", "llama3"):
        raise UnsupportedModel(f"rope scaling type {kind!r} is not supported")
    return RopeConfig(
        theta=theta,
        kind=kind,
        factor=float(params.get("factor", 1.0)),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=int(params.get("original_max_position_embeddings", 8192)),
    )


def _as_ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)


def load_model_config(model_dir: Path) -> ModelConfig:
    model_dir = Path(model_dir)
    raw = json.loads((model_dir / "config.json").read_text())
    model_type = raw.get("model_type", "")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModel(
            f"model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if raw.get("hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"hidden_act {raw['hidden_act']!r} is not supported")
    heads = raw["num_attention_heads"]
    eos = set(_as_ids(raw.get("eos_token_id")))
    gen_path = model_dir / "generation_config.json"
    if gen_path.exists():
        eos |= set(_as_ids(json.loads(gen_path.read_text()).get("eos_token_id")))
    return ModelConfig(
        model_type=model_type,
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads") or heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        rope=_rope_from(raw),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),
        eos_token_ids=tuple(sorted(eos)),
        bos_token_id=raw.get("bos_token_id"),
    )


def load_sampling_defaults(model_dir: Path) -> dict:
    """temperature / top_p / top_k from generation_config.json, as vLLM reads
    them: what a request gets when it does not name them (OpenAI's own
    defaults otherwise)."""
    path = Path(model_dir) / "generation_config.json"
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    return {k: raw[k] for k in ("temperature", "top_p", "top_k") if k in raw}
