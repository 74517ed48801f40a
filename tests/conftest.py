"""Shared builders: the real default model, a tiny random model, engines over them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bulkhead.model.gguf_import import default_model_dir
from tests.ci_skips import pytest_configure  # noqa: F401  (CI lists its skips and fails on one this machine could run)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
TEST_KEYS = {"sk-alpha-test": "alpha", "sk-beta-test": "beta"}


def write_keys_file(directory: Path) -> Path:
    """A keys.toml naming the two test tenants."""
    path = Path(directory) / "keys.toml"
    path.write_text("[keys]\n" + "".join(f'"{k}" = "{t}"\n' for k, t in TEST_KEYS.items()))
    return path


def openai_client(url: str, key: str):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The bundled SmolLM2-135M-Instruct as a safetensors directory (converted once, cached)."""
    return default_model_dir()


def make_tiny_model(out: Path, tokenizer_from: Path, model_type: str = "llama", **overrides) -> Path:
    """A random Llama-family checkpoint with SmolLM2's tokenizer (so text round-trips)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    kwargs = dict(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
    )
    kwargs.update(overrides)
    config = AutoConfig.for_model(model_type, **kwargs)
    model = AutoModelForCausalLM.from_config(config).float()
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, out / name)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm2_dir) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny-llama"), smollm2_dir)


@pytest.fixture
def make_engine(tiny_model_dir):
    """Build a colocated engine (not started: tests drive it with run_until_idle)."""
    from bulkhead.engine.builder import EngineConfig, build_engine

    def build(**overrides):
        cfg = dict(model_dir=tiny_model_dir, model_id="tiny", kv_memory_bytes=64 * 2**20, scrub_mode="poison")
        cfg.update(overrides)
        return build_engine(EngineConfig(**cfg))

    return build
