"""A bf16 checkpoint is loaded as stored, never widened whole to fp32
(loader.held_as_stored): a 1B model's fp32 copy is 4.3 GB, and two workers
each holding one ran out of memory. Its matrices stay bf16 from the file to
the kernels' packing; the exact path widens them layer by layer; the token
embedding is looked up as the exact fp32 rows."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bulkhead.engine.builder import EngineConfig, build_engine
from bulkhead.model import bf16in_kernel, linear_kernel
from bulkhead.model.bf16_embedding import BF16Embedding
from bulkhead.model.loader import load_weights


def stored_rows(model_dir: Path) -> torch.Tensor:
    (f,) = model_dir.glob("*.safetensors")
    return load_file(str(f))["model.embed_tokens.weight"]


def test_the_loader_holds_a_bf16_checkpoints_matrices_in_bf16(bf16_dir):
    _, weights = load_weights(bf16_dir, torch.float32)
    matrices = [weights.embed, *(getattr(layer, name) for layer in weights.layers for name in linear_kernel.LINEARS)]
    assert {t.dtype for t in matrices} == {torch.bfloat16}
    assert weights.final_norm.dtype == weights.layers[0].input_norm.dtype == torch.float32  # the model's dtype
    _, as_bf16_model = load_weights(bf16_dir, torch.bfloat16)  # --dtype bfloat16: everything in it, as before
    assert as_bf16_model.final_norm.dtype == torch.bfloat16


def test_the_exact_path_widens_them_exactly(bf16_dir):
    _, weights = load_weights(bf16_dir, torch.float32)
    o = weights.layers[0].o.float()
    laid = linear_kernel.prepare(weights, "aten")
    assert laid.layers[0].o.w.dtype == torch.float32 and torch.equal(laid.layers[0].o.w, o)
    ids = torch.tensor([[0, 5, 17]])
    assert laid.embed.dtype == torch.float32 and torch.equal(laid.embed[ids], stored_rows(bf16_dir)[ids].float())
    assert laid.lm_head.w.dtype == torch.float32


def test_release_drops_the_plain_layers_as_they_are_laid_out(bf16_dir):
    _, weights = load_weights(bf16_dir, torch.float32)
    laid = linear_kernel.prepare(weights, "aten", release=True)
    assert weights.layers == [None] * len(laid.layers)


@pytest.mark.skipif(bf16in_kernel.load() is None, reason="no AVX-512 BF16 here: a bf16 checkpoint runs exact")
def test_the_engine_holds_no_fp32_matrix_of_a_bf16_checkpoint(bf16_dir):
    built = build_engine(EngineConfig(model_dir=bf16_dir, model_id="tiny", kv_memory_bytes=16 * 2**20))
    weights = built.engine.runner.model.weights
    assert (built.linear_kernel, built.lm_head_kernel) == ("bf16", "bf16-in")
    packed = [getattr(layer, name).packed[0] for layer in weights.layers for name in linear_kernel.LINEARS]
    assert {t.dtype for t in [*packed, weights.lm_head.packed]} == {torch.bfloat16}
    # Tied: token lookup reads the lm_head's packing, the stored rows exactly, in fp32.
    assert isinstance(weights.embed, BF16Embedding) and weights.embed.rows is None
    ids = torch.tensor([[0, 31, 32], [33, 1000, weights.embed.shape[0] - 1]])
    rows = weights.embed[ids]
    assert rows.dtype == torch.float32 and rows.shape == (2, 3, weights.embed.shape[1])
    assert torch.equal(rows, stored_rows(bf16_dir)[ids].float())
    for t in (0, 31, 32, 1000):  # one decode row's lookup (plain indexing) reads the same row
        assert torch.equal(weights.embed[torch.tensor([t])], stored_rows(bf16_dir)[t:t + 1].float())
