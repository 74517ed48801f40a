"""An fp16 checkpoint runs the bf16 row (kernel_table.BF16_ROW): its
matrices are held as stored (loader.held_as_stored), rounded to bf16 once as
the bf16 kernels pack them, never widened whole to fp32; the exact path
(`--precision exact`) widens the stored fp16 values exactly, layer by layer."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from bulkhead.engine.builder import EngineConfig, build_engine
from bulkhead.model import bf16in_kernel, kernel_table, linear_kernel
from bulkhead.model.loader import load_weights
from bulkhead.model.weight_format import linear_format
from tests.conftest import make_tiny_model


@pytest.fixture(scope="module")
def f16_dir(tmp_path_factory, smollm2_dir) -> Path:
    """A tiny random checkpoint saved as fp16 safetensors: most values lie off the bf16 grid."""
    out = make_tiny_model(tmp_path_factory.mktemp("f16"), smollm2_dir, hidden_size=128, intermediate_size=256,
                          num_attention_heads=2, num_key_value_heads=1)
    for f in out.glob("*.safetensors"):
        save_file({k: v.half().contiguous() for k, v in load_file(str(f)).items()}, str(f), metadata={"format": "pt"})
    return out


def stored(model_dir: Path, name: str) -> torch.Tensor:
    (f,) = model_dir.glob("*.safetensors")
    return load_file(str(f))[name]


def test_the_table_serves_f16_on_the_bf16_row():
    rows = kernel_table.rows_for("F16", frozenset({kernel_table.BF16}))
    assert rows[0].linear == "bf16" and rows[-1] is kernel_table.EXACT


def test_the_loader_holds_an_f16_checkpoints_matrices_as_stored(f16_dir):
    _, weights = load_weights(f16_dir, torch.float32)
    matrices = [weights.embed, *(getattr(layer, name) for layer in weights.layers for name in linear_kernel.LINEARS)]
    assert {t.dtype for t in matrices} == {torch.float16}
    assert weights.final_norm.dtype == torch.float32


def test_the_exact_path_keeps_the_fp16_values_exactly(f16_dir):
    _, weights = load_weights(f16_dir, torch.float32)
    assert linear_kernel.choose("exact", torch.float32, weights, linear_format(f16_dir)) in ("onednn", "aten")
    laid = linear_kernel.prepare(weights, "aten")
    o = stored(f16_dir, "model.layers.0.self_attn.o_proj.weight")
    assert not torch.equal(o.bfloat16().float(), o.float())  # the values are off the bf16 grid: the test bites
    assert laid.layers[0].o.w.dtype == torch.float32 and torch.equal(laid.layers[0].o.w, o.float())
    ids = torch.tensor([[0, 5, 17]])
    assert torch.equal(laid.embed[ids], stored(f16_dir, "model.embed_tokens.weight")[ids].float())


@pytest.mark.skipif(bf16in_kernel.load() is None, reason="no AVX-512 BF16 here: an fp16 checkpoint runs exact")
def test_the_engine_runs_an_f16_checkpoint_on_bf16_weights(f16_dir):
    built = build_engine(EngineConfig(model_dir=f16_dir, model_id="tiny", kv_memory_bytes=16 * 2**20))
    weights = built.engine.runner.model.weights
    assert (built.linear_kernel, built.lm_head_kernel) == ("bf16", "bf16-in")
    packed = [getattr(layer, name).packed[0] for layer in weights.layers for name in linear_kernel.LINEARS]
    assert {t.dtype for t in [*packed, weights.lm_head.packed]} == {torch.bfloat16}
    o = stored(f16_dir, "model.layers.0.self_attn.o_proj.weight")
    assert torch.equal(weights.layers[0].o.packed[0], bf16in_kernel.pack(o.bfloat16()))  # rounded once, as packed
