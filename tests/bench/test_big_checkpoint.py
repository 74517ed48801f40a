"""bench/big_checkpoint.py at a tiny shape: the safetensors and the GGUF
files hold the same weights (the GGUF's q and k rows permuted as llama.cpp
expects them, so an import gives back the safetensors' tensors), and the
bf16 checkpoint serves."""

import pytest
import torch
from safetensors.torch import load_file

from bench import big_checkpoint, checkpoints
from bulkhead.engine.builder import EngineConfig, build_engine
from bulkhead.model import bf16in_kernel

TINY = big_checkpoint.Shape(hidden=128, layers=3, heads=2, kv_heads=1, ff=256, context=512)


def read_dir(model_dir) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    return big_checkpoint.write_safetensors(tmp_path_factory.mktemp("big") / "bf16", TINY)


def test_the_real_shape_has_about_a_billion_parameters():
    assert 1.0e9 < big_checkpoint.LLAMA_3_2_1B.parameters() < 1.3e9


def test_shards_and_index_cover_every_tensor_once(bf16_dir):
    import json

    index = json.loads((bf16_dir / "model.safetensors.index.json").read_text())["weight_map"]
    tensors = read_dir(bf16_dir)
    assert set(index) == set(tensors) and len(tensors) == 2 + TINY.layers * 9
    assert len(set(index.values())) == 1  # 3 layers: one shard of SHARD_LAYERS
    assert all(t.dtype == torch.bfloat16 and torch.isfinite(t.float()).all() for t in tensors.values())


def test_an_imported_bf16_gguf_gives_back_the_safetensors_weights(bf16_dir, tmp_path):
    gguf_file = big_checkpoint.write_gguf(tmp_path / "tiny.BF16.gguf", TINY, linear_type="BF16", embed_type="BF16")
    imported = read_dir(checkpoints.import_gguf(gguf_file, tmp_path / "imported"))
    for name, want in read_dir(bf16_dir).items():
        # q_proj and k_proj would differ here without the rotary permutation
        assert torch.equal(imported[name].float(), want.float()), name


def test_the_q4_0_gguf_is_the_same_weights_each_within_a_step_of_its_group(bf16_dir, tmp_path):
    import gguf

    reader = gguf.GGUFReader(big_checkpoint.write_gguf(tmp_path / "tiny.Q4_0.gguf", TINY))
    stored = {t.name: t for t in reader.tensors}
    want = read_dir(bf16_dir)
    for i in range(TINY.layers):
        for hf, name, heads in (("self_attn.q_proj", "attn_q", TINY.heads), ("mlp.down_proj", "ffn_down", None)):
            w = want[f"model.layers.{i}.{hf}.weight"].float().numpy()
            w = big_checkpoint.permute_rotary(w, heads) if heads else w
            t = stored[f"blk.{i}.{name}.weight"]
            assert t.tensor_type == gguf.GGMLQuantizationType.Q4_0
            q = gguf.quants.dequantize(t.data, t.tensor_type).reshape(w.shape)
            # Q4_0: a group's largest |w| is step -8 of 16 (-8..7), so a weight is within half a step,
            # or one step at the far end, of its group's grid: a wrong row order lands far outside
            groups, errs = abs(w).reshape(-1, 32), abs(w - q).reshape(-1, 32)
            assert (errs <= groups.max(1, keepdims=True) / 8 * 1.01 + 1e-7).all(), name


def test_the_bf16_checkpoint_serves_with_finite_logits(bf16_dir):
    from bulkhead.engine.scheduler import PrefillWork, StepPlan

    built = build_engine(EngineConfig(model_dir=bf16_dir, model_id="big", kv_memory_bytes=8 * 2**20))
    if bf16in_kernel.load() is not None:
        assert built.linear_kernel == "bf16"  # stored bf16: the weights run as stored
    runner = built.engine.runner
    pages = tuple(runner.ledger.allocate("r", "t", 2))
    _, logits = runner.run(StepPlan((PrefillWork("r", "t", 0, tuple(range(100, 120)), pages, True),), (), ()))
    assert torch.isfinite(logits).all() and 0.1 < float(logits.std()) < 10
