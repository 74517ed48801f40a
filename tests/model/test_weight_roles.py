"""Each worker lays out only what its passes run (issue 35, the ~1B shape):
a prefill worker the prompt kernel's bf16 packing, a decode worker the
4-bit or per-format codes (its recomputed prompts run the decode kernel),
the colocated engine both; a GGUF's layers are decoded and laid out one at a
time. Compared with the colocated layout, each role's numbers are the same."""

import weakref

import pytest
import torch

from bench import checkpoints
from bulkhead.model import format_linear, gguf_import, i16in_kernel, loader, prepared_weights
from bulkhead.model.format_linear import CodedLinear
from bulkhead.model.linear_kernel import BF16InLinear
from tests.model.test_format_linear import MIXED
from tests.model.test_weight_format import SHAPES, build

needs_i16in = pytest.mark.skipif(i16in_kernel.load() is None, reason="no AVX-512 VNNI/BF16 or no compiler here")
LINEARS = ("qkv", "o", "gate_up", "down")


@pytest.fixture(scope="module")
def q4_0_dir(tmp_path_factory):
    return gguf_import.model_dir_for(checkpoints.write_gguf(tmp_path_factory.mktemp("q4") / "tiny.Q4_0.gguf",
                                                            "Q4_0", **SHAPES))


@pytest.fixture(scope="module")
def mixed_dir(tmp_path_factory):
    return gguf_import.model_dir_for(checkpoints.write_gguf(tmp_path_factory.mktemp("mixed") / "mixed.gguf",
                                                            "Q4_0", types=MIXED, **SHAPES))


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BULKHEAD_CACHE", str(tmp_path))


def linears(weights):
    return [getattr(layer, name) for layer in weights.layers for name in LINEARS]


def held_dtypes(lin) -> set:
    """The dtypes of every tensor a laid-out layer holds (its packings)."""
    tensors = [lin.wb] if isinstance(lin, BF16InLinear) else list(getattr(lin, "weights", lin.packed))
    if getattr(lin, "prefill", None) is not None:
        tensors.append(lin.prefill.wb)
    return {t.dtype for t in tensors}


@needs_i16in
@pytest.mark.parametrize("fixture", ["q4_0_dir", "mixed_dir"])
def test_a_prefill_worker_holds_no_decode_packing_and_a_decode_worker_no_prompt_copy(request, fixture, fresh_cache):
    model_dir = request.getfixturevalue(fixture)
    for _ in range(2):  # laid out, then read back from this machine's cache (where the kernel is cached)
        _, prompts, kernel, _ = prepared_weights.load_laid_out(model_dir, torch.float32, "auto", runs="prompts")
        _, decode, _, _ = prepared_weights.load_laid_out(model_dir, torch.float32, "auto", runs="decode")
        _, both, _, _ = prepared_weights.load_laid_out(model_dir, torch.float32, "auto")
        assert kernel in ("q4-i16in", "gguf-i16in")
        assert all(type(lin) is BF16InLinear for lin in linears(prompts))
        assert all(isinstance(lin, CodedLinear) and lin.prefill is None for lin in linears(decode))
        assert all(torch.bfloat16 not in held_dtypes(lin) for lin in linears(decode))
        assert all(isinstance(lin, CodedLinear) and isinstance(lin.prefill, BF16InLinear) for lin in linears(both))


@needs_i16in
@pytest.mark.parametrize("fixture", ["q4_0_dir", "mixed_dir"])
def test_each_role_computes_the_colocated_layouts_numbers(request, fixture, fresh_cache):
    """Prompt rows on a prefill worker and decode rows on a decode worker:
    the colocated engine's numbers bit for bit. A decode worker's prompt
    rows (a recompute) are its decode kernel's, near the prompt kernel's."""
    model_dir = request.getfixturevalue(fixture)
    layout = {runs: prepared_weights.load_laid_out(model_dir, torch.float32, "auto", runs=runs)[1]
              for runs in ("both", "prompts", "decode")}
    gen = torch.Generator().manual_seed(0)
    for name in LINEARS:
        both, prompts, decode = (getattr(layout[r].layers[1], name) for r in ("both", "prompts", "decode"))
        x = torch.randn(5, both.in_features, generator=gen)
        assert torch.equal(prompts(x), both(x))
        assert torch.equal(decode(x, decode=True), both(x, decode=True))
        assert torch.equal(decode(x), both(x, decode=True))  # the recompute's rows: the decode kernel
        torch.testing.assert_close(decode(x), both(x), rtol=0.05, atol=0.05)
        if name == "gate_up":
            assert decode.silu_mul(x) is None and prompts.silu_mul(x) is not None


@needs_i16in
def test_the_engines_of_each_role_lay_out_their_own_part(q4_0_dir, fresh_cache):
    from bulkhead.engine.builder import EngineConfig, build_engine
    from tests.model.test_weight_format import logits_of

    cfg = EngineConfig(model_dir=q4_0_dir, model_id="tiny", kv_memory_bytes=16 * 2**20)
    prefill, decode = build_engine(cfg, prefill_only=True), build_engine(cfg, decode_only=True)
    colocated = build(q4_0_dir)
    assert all(type(lin) is BF16InLinear for lin in linears(prefill.engine.runner.model.weights))
    assert prefill.decode_row_multiple == 0  # a prefill worker never decodes: nothing measured
    assert all(lin.prefill is None for lin in linears(decode.engine.runner.model.weights))
    assert decode.engine.runner.model.decode_glue == colocated.engine.runner.model.decode_glue
    # The decode worker's whole pass (its prompt through the decode kernel, then decode steps) near the colocated one.
    torch.testing.assert_close(logits_of(decode), logits_of(colocated), rtol=0.05, atol=0.05)


def test_a_ggufs_layers_are_decoded_one_at_a_time_as_they_are_laid_out(q4_0_dir, monkeypatch):
    """The lazy layers equal the eager ones, and laying them out never holds
    two layers' plain weights: each is dropped before the next is decoded."""
    _, eager = loader.load_weights(q4_0_dir)
    _, lazy = loader.load_weights(q4_0_dir, lazy=True)
    assert isinstance(lazy.layers, loader.GGUFLayers)
    for a, b in zip(eager.layers, lazy.layers, strict=True):
        for name in ("input_norm", "post_norm", *LINEARS):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert format_linear.codes_of(b.qkv) is not None
    built, alive = loader.GGUFLayers.__getitem__, []

    def tracked(self, i):
        assert not [r for r in alive if r() is not None], "a previous layer's plain weights are still held"
        layer = built(self, i)
        alive.append(weakref.ref(layer.gate_up))
        return layer

    monkeypatch.setattr(loader.GGUFLayers, "__getitem__", tracked)
    from bulkhead.model import linear_kernel

    laid = linear_kernel.prepare(lazy, "q4" if i16in_kernel.load() is None else "q4-i16in", release=True)
    assert len(alive) == len(laid.layers) == SHAPES["layers"]


@needs_i16in
def test_adapter_rows_take_the_c_delta_on_a_prefill_worker_too(q4_0_dir, fresh_cache):
    # A prefill worker has no C decode layers; its adapter prompts ran the
    # fp32 torch delta and took 2.3x the base's time to first token, served.
    from bulkhead.engine.builder import EngineConfig, build_engine
    from bulkhead.model import lora_layers

    if lora_layers.load() is None:
        pytest.skip("the C LoRA delta does not build here")
    cfg = EngineConfig(model_dir=q4_0_dir, model_id="tiny", kv_memory_bytes=16 * 2**20)
    for built in (build_engine(cfg, prefill_only=True), build_engine(cfg, decode_only=True)):
        assert built.engine.runner.model.adapter_packing is lora_layers.pack_only
