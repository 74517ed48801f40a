"""Fixtures the model tests share."""

from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tests.conftest import make_tiny_model


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory, smollm2_dir) -> Path:
    """A tiny random checkpoint saved as bf16 safetensors (SmolLM2's shapes, smaller)."""
    out = make_tiny_model(tmp_path_factory.mktemp("bf16"), smollm2_dir, hidden_size=128, intermediate_size=256,
                          num_attention_heads=2, num_key_value_heads=1)
    for f in out.glob("*.safetensors"):
        save_file({k: v.bfloat16().contiguous() for k, v in load_file(str(f)).items()}, str(f),
                  metadata={"format": "pt"})
    return out
