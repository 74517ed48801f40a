"""A GGUF file's weights read as stored (bulkhead.model.gguf_weights, issue 35
item 1): each tensor keeps its stored type's label and codes, the loader's
weights are the transformers import's values, the kernels take the stored
codes without searching for them, and `bulkhead serve --model FILE.gguf` runs."""

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, quants

from bench import checkpoints
from bulkhead.model import gguf_import, gguf_weights, i16in_kernel, linear_kernel, q4_kernel, weight_format
from bulkhead.model.gguf_codes import Q4Codes, Q8Codes, Values
from bulkhead.model.loader import build_weights, load_weights
from bulkhead.model.llama import ModelWeights
from tests.model.test_weight_format import SHAPES, assert_close_to_exact, build, build_exact
from tests.model import kernel_calls

# One matrix kind per type the reader decodes (Q5_0 through gguf_kquants, onto the 8-bit grid), so a mislabel shows.
MIXED = {"attn_q": "Q4_1", "attn_k": "Q4_0", "attn_v": "Q8_0", "attn_output": "F16", "ffn_gate": "BF16",
         "ffn_up": "F32", "ffn_down": "Q5_0", "token_embd": "Q8_0"}
KIND = {"Q4_0": Q4Codes, "Q4_1": Q4Codes, "Q8_0": Q8Codes, "F16": Values, "BF16": Values, "F32": Values,
        "Q5_0": Q8Codes}


@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory) -> Path:
    return checkpoints.write_gguf(tmp_path_factory.mktemp("mixed") / "mixed.gguf", "Q4_0", types=MIXED, **SHAPES)


@pytest.fixture(scope="module")
def q4_0_gguf(tmp_path_factory) -> Path:
    return checkpoints.write_gguf(tmp_path_factory.mktemp("q4_0") / "tiny.Q4_0.gguf", "Q4_0", **SHAPES)


def test_every_tensor_keeps_its_stored_type(tmp_path):
    """The label is the file's own, and the decoded kind matches it (a file of tensors only: quick to read)."""
    import gguf

    writer = gguf.GGUFWriter(tmp_path / "types.gguf", "llama")
    rng = np.random.default_rng(0)
    for kind, type_name in MIXED.items():
        qtype = GGMLQuantizationType[type_name]
        w = (rng.standard_normal((64, 128)) * 0.05).astype(np.float32)
        name = "token_embd.weight" if kind == "token_embd" else f"blk.0.{kind}.weight"
        writer.add_tensor(name, quants.quantize(w, qtype), raw_dtype=qtype)
    checkpoints._write(writer)
    f = gguf_weights.GGUFFile(tmp_path / "types.gguf")
    truth = {t.name: t.tensor_type.name for t in GGUFReader(tmp_path / "types.gguf").tensors}
    assert {name.split(".")[-2]: type_name for name, type_name in truth.items()} == MIXED
    assert {name: f.formats()[gguf_weights.hf_name(name)] for name in truth} == truth
    for gguf_name, type_name in truth.items():
        assert isinstance(f.decoded(gguf_weights.hf_name(gguf_name), 2, 1), KIND[type_name]), gguf_name


def assert_same_weights(a: ModelWeights, b: ModelWeights) -> None:
    for la, lb in zip(a.layers, b.layers, strict=True):
        for field in ("input_norm", "qkv", "o", "post_norm", "gate_up", "down"):
            assert torch.equal(getattr(la, field), getattr(lb, field)), field
    assert torch.equal(a.embed, b.embed) and torch.equal(a.final_norm, b.final_norm)
    assert torch.equal(a.lm_head, b.lm_head)


def test_the_weights_are_the_transformers_imports_values(mixed_gguf, tmp_path):
    """Names and the q/k row order (llama.cpp permutes them for its RoPE) as
    transformers' import gives them, every type's values exactly."""
    model_dir = gguf_import.model_dir_for(mixed_gguf)
    assert not list(model_dir.glob("*.safetensors"))  # config and tokenizer only: the weights stay in the file
    config, direct = load_weights(model_dir)
    converted = gguf_import.convert_gguf(mixed_gguf, tmp_path / "converted")
    assert_same_weights(direct, load_weights(converted)[1])
    assert weight_format.stored_formats(model_dir)["model.layers.1.mlp.down_proj.weight"] == "Q5_0"


def test_the_kernels_take_the_stored_codes_without_a_search(q4_0_gguf, monkeypatch):
    model_dir = gguf_import.model_dir_for(q4_0_gguf)

    def no_search(w):
        raise AssertionError("the grid was searched for in fp32 values")

    monkeypatch.setattr(q4_kernel, "_solve_grid", no_search)
    monkeypatch.setattr(i16in_kernel, "_solve_q8_grid", no_search)
    _, weights = load_weights(model_dir)
    for layer in weights.layers:
        for w in (layer.qkv, layer.o, layer.gate_up, layer.down):
            q, d, m = q4_kernel.grid(w)
            assert torch.equal((q.float() * d + m).reshape(w.shape), w)
    assert i16in_kernel.q8_grid(weights.lm_head) is not None


def test_stored_codes_pack_as_the_grid_search_over_the_values_packs(q4_0_gguf):
    """Today's path (the fp32 values, the transformers import's as the test
    above shows, then the grid search) and the direct one give the kernels the same bytes."""
    _, direct = load_weights(gguf_import.model_dir_for(q4_0_gguf))
    for layer in direct.layers:
        for field in ("qkv", "o", "gate_up", "down"):
            w = getattr(layer, field)
            searched = kernel_calls.q4_pack(w.clone())  # a new tensor: nothing remembered for it, so searched
            assert all(torch.equal(x, y) for x, y in zip(kernel_calls.q4_pack(w), searched))
    assert all(torch.equal(x, y) for x, y in zip(i16in_kernel.pack_q8(direct.lm_head),
                                                 i16in_kernel.pack_q8(direct.lm_head.clone())))


def test_the_bundled_file_decodes_to_gguf_pys_values_and_the_searched_packing():
    """The bundled SmolLM2 (Q4_1, Q8_0 token_embd): a first, middle and last layer and the embedding."""
    path = gguf_import.bundled_gguf_path()
    f = gguf_weights.GGUFFile(path)
    reader = {t.name: t for t in GGUFReader(path).tensors}
    # Not q and k, whose rows the reader reorders (the mixed file's test compares those with transformers').
    for gguf_name in ("token_embd.weight", "blk.0.attn_v.weight", "blk.0.ffn_down.weight",
                      "blk.15.attn_output.weight", "blk.29.ffn_up.weight", "blk.29.attn_norm.weight"):
        t = reader[gguf_name]
        found = f.decoded(gguf_weights.hf_name(gguf_name), 9, 3)
        ref = torch.from_numpy(np.ascontiguousarray(quants.dequantize(t.data, t.tensor_type)))
        assert torch.equal(found.values(), ref.reshape(found.values().shape)), gguf_name
        if isinstance(found, Q4Codes):
            searched = kernel_calls.q4_pack(ref.clone())
            assert all(torch.equal(x, y) for x, y in zip(q4_kernel.pack_grid(found.q, found.d, found.m), searched))
        if isinstance(found, Q8Codes):
            direct = i16in_kernel.pack_q8_grid(found.q, found.d)
            assert all(torch.equal(x, y) for x, y in zip(direct, i16in_kernel.pack_q8(ref.clone())))
    assert t.tensor_type == GGMLQuantizationType.F32


def test_the_exact_path_holds_the_stored_weights_exact_values(mixed_gguf):
    """`--linear-kernel aten`: every linear layer's fp32 weight is the
    dequantized file's, whatever its type (Q5_0 through gguf_kquants' decoder)."""
    built = build(gguf_import.model_dir_for(mixed_gguf), linear_kernel="aten", kv_dtype="float32")
    _, plain = load_weights(gguf_import.model_dir_for(mixed_gguf))
    layer = built.engine.runner.model.weights.layers[1]
    assert torch.equal(layer.down.w, plain.layers[1].down) and torch.equal(layer.qkv.w, plain.layers[1].qkv)
    info = weight_format.describe(gguf_import.model_dir_for(mixed_gguf), built.linear_kernel, built.lm_head_kernel)
    assert info["down"] == {"stored": "Q5_0", "kernel": "aten"}  # decoded, not gguf-py's fallback
    assert info["qkv"]["stored"] == "Q4_0+Q4_1+Q8_0"


def test_a_q4_0_gguf_served_directly_runs_the_4bit_kernels_near_the_exact_path(q4_0_gguf):
    model_dir = gguf_import.model_dir_for(q4_0_gguf)
    fast = build(model_dir)
    assert fast.linear_kernel in linear_kernel.Q4_KERNELS
    info = weight_format.describe(model_dir, fast.linear_kernel, fast.lm_head_kernel)
    assert info["gate_up"] == {"stored": "Q4_0", "kernel": fast.linear_kernel}
    assert info["lm_head"]["stored"] == info["embed"]["stored"] == "Q8_0"
    if i16in_kernel.load() is not None:
        assert (fast.linear_kernel, fast.lm_head_kernel) == ("q4-i16in", "q8-i16in")
    assert_close_to_exact(fast, build_exact(model_dir))


@pytest.mark.e2e
def test_bulkhead_serve_takes_a_gguf_file(q4_0_gguf, tmp_path):
    from tests.conftest import openai_client
    from tests.server_process import ServerProcess

    proc = ServerProcess(["--role", "colocated", "--model", str(q4_0_gguf), "--kv-memory", "64MiB"],
                         tmp_path / "server.log").wait_ready()
    try:
        done = openai_client(proc.url, "unused").completions.create(model="tiny.Q4_0", prompt="Hi", max_tokens=4)
        assert done.choices[0].finish_reason in ("length", "stop")
        info = proc.info()
        assert info["model"] == "tiny.Q4_0"
        assert info["weights"]["qkv"] == {"stored": "Q4_0", "kernel": info["linear_kernel"]}
        assert info["weights"]["norms"]["stored"] == "F32"
    finally:
        proc.stop()


def test_build_weights_keeps_a_decoded_tensor_in_place():
    """mapped=False: the loader's GGUF tensors are its own memory; a copy would
    lose the kernels' remembered codes for the embedding."""
    from bulkhead.model.config import load_model_config

    config = load_model_config(gguf_import.default_model_dir())
    tensors = {"model.embed_tokens.weight": torch.zeros(4, 4), "model.norm.weight": torch.ones(4)}
    embed = tensors["model.embed_tokens.weight"]
    weights = build_weights(config.__class__(**{**config.__dict__, "num_layers": 0}), tensors, torch.float32,
                            mapped=False)
    assert weights.embed is embed
