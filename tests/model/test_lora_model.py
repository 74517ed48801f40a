"""A request under a LoRA adapter gets the merged model's numbers: the
exact path against transformers running the same base with the adapter
merged into its weights (W + scaling * B @ A), prefill and decode."""

import pytest
import torch

from bulkhead.engine.adapter_store import AdapterStore
from bulkhead.engine.admission import AdapterRef
from bulkhead.engine.runner import ModelRunner, RunnerConfig
from bulkhead.engine.step_plan import DecodeWork, PrefillWork, StepPlan
from bulkhead.errors import AdapterUnavailable
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.ledger import PageLedger
from bulkhead.kv.pool import KVPool
from bulkhead.lora.peft_files import MODULES, BaseShapes, read_adapter
from bulkhead.model import lora_kernel
from bulkhead.model.loader import load_model
from bench.lora_adapters import write_adapter

IDS = list(range(200, 232))


def _runner(model, decode_row_multiple=1):
    """decode_row_multiple: the engine pads decode rows to a multiple measured
    batch-invariant (bulkhead.model.row_invariance); MKL's is 4 here."""
    c = model.config
    layout = KVLayout(c.num_layers, c.num_kv_heads, c.head_dim, 16, "float32")
    return ModelRunner(model, KVPool(layout, 32, "poison"), PageLedger(32),
                       RunnerConfig(prefill_row_bucket=0, decode_row_multiple=decode_row_multiple)), layout


def _logits(runner, layout, rid, ids, adapter):
    """Logits after the prompt (all but the last 3 tokens) and at each of the last 3, decoded."""
    pages = tuple(runner.ledger.allocate(rid, "t", layout.pages_for_tokens(len(ids))))
    n = len(ids) - 3
    _, first = runner.run(StepPlan(PrefillWork(rid, "t", 0, tuple(ids[:n]), pages, True, adapter=adapter), (), ()))
    out = [first[0]]
    for pos in range(n, len(ids)):
        _, logits = runner.run(StepPlan(None, (DecodeWork(rid, "t", pos, ids[pos], pages, adapter),), ()))
        out.append(logits[0])
    return torch.stack(out)


def _merged_reference(model_dir, adapter_dir, ids):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    files = read_adapter(adapter_dir, BaseShapes.of(load_model(model_dir).config))
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    with torch.no_grad():
        for layer, module in files.targets:
            prefix = f"base_model.model.model.layers.{layer}.{MODULES[module]}.{module}"
            a, b = tensors[f"{prefix}.lora_A.weight"].float(), tensors[f"{prefix}.lora_B.weight"].float()
            getattr(getattr(hf.model.layers[layer], MODULES[module]), module).weight += files.scaling * b @ a
        logits = hf(torch.tensor([ids])).logits[0]
    n = len(ids) - 3
    return logits[n - 1: len(ids)][: 4], logits


@pytest.mark.parametrize("targets", [tuple(MODULES), ("q_proj", "v_proj"), ("gate_proj", "down_proj")])
def test_the_adapter_path_equals_transformers_with_the_adapter_merged(tiny_model_dir, tmp_path, targets):
    model = load_model(tiny_model_dir, linear_kernel="aten")
    adapter_dir = write_adapter(tmp_path / "a", BaseShapes.of(model.config), rank=8, alpha=16, targets=targets,
                                scale=0.2)
    files = read_adapter(adapter_dir, BaseShapes.of(model.config))
    runner, layout = _runner(model)
    runner.adapters.acquire(AdapterRef("sql", str(adapter_dir), files.digest))
    ours = _logits(runner, layout, "r", IDS, files.digest)
    base = _logits(runner, layout, "b", IDS, None)
    _, ref = _merged_reference(tiny_model_dir, adapter_dir, IDS)
    positions = [len(IDS) - 4, len(IDS) - 3, len(IDS) - 2, len(IDS) - 1]
    expected = ref[positions]
    assert (ours - expected).abs().max().item() < 1e-4
    assert torch.equal(ours.argmax(-1), expected.argmax(-1))
    assert (base - expected).abs().max().item() > 1e-2  # the adapter changes the numbers: the test can fail


@pytest.mark.parametrize("delta_kernel", ["c", "torch"])
def test_a_row_gets_the_same_numbers_alone_and_beside_others(tiny_model_dir, tmp_path, monkeypatch, delta_kernel):
    """Batch invariance with adapters: decode rows of two adapters and the base model share one pass,
    through the C delta (csrc/lora_delta.c) and through the tiled torch matmuls it falls back to."""
    if delta_kernel == "torch":
        monkeypatch.setattr(lora_kernel, "load", lambda: None)
    elif lora_kernel.load() is None:
        pytest.skip("the C LoRA delta does not build here")
    model = load_model(tiny_model_dir, linear_kernel="aten")
    shapes = BaseShapes.of(model.config)
    refs = []
    for i in range(2):
        d = write_adapter(tmp_path / f"a{i}", shapes, seed=i, scale=0.2)
        refs.append(AdapterRef(f"a{i}", str(d), read_adapter(d, shapes).digest))
    runner, layout = _runner(model, decode_row_multiple=4)
    for ref in refs:
        runner.adapters.acquire(ref)
    alone = _logits(runner, layout, "alone", IDS, refs[0].digest)
    # The same request again, its decode steps beside the base model's and the other adapter's rows.
    rids = {"x": refs[0].digest, "y": None, "z": refs[1].digest, "w": refs[0].digest}
    pages = {r: tuple(runner.ledger.allocate(r, "t", layout.pages_for_tokens(len(IDS)))) for r in rids}
    n = len(IDS) - 3
    for r, digest in rids.items():
        runner.run(StepPlan(PrefillWork(r, "t", 0, tuple(IDS[:n]), pages[r], True, adapter=digest), (), ()))
    for pos in range(n, len(IDS)):
        ids, logits = runner.run(StepPlan(None, tuple(DecodeWork(r, "t", pos, IDS[pos], pages[r], d)
                                                      for r, d in rids.items()), ()))
        assert torch.equal(logits[ids.index("x")], alone[pos - n + 1])
        assert not torch.equal(logits[ids.index("y")], alone[pos - n + 1])


def test_weights_changed_after_admission_are_refused(tiny_model_dir, tmp_path):
    model = load_model(tiny_model_dir, linear_kernel="aten")
    shapes = BaseShapes.of(model.config)
    d = write_adapter(tmp_path / "a", shapes, seed=1)
    admitted = read_adapter(d, shapes).digest
    write_adapter(d, shapes, seed=2)  # swapped on disk after the ticket was signed
    with pytest.raises(AdapterUnavailable, match="cannot be served as it was admitted") as e:
        AdapterStore(model.config).acquire(AdapterRef("sql", str(d), admitted))
    assert str(d) not in e.value.message  # the path stays in the operator's log


def test_the_c_delta_and_the_torch_fallback_agree(tiny_model_dir, tmp_path, monkeypatch):
    model = load_model(tiny_model_dir, linear_kernel="aten")
    shapes = BaseShapes.of(model.config)
    d = write_adapter(tmp_path / "a", shapes, rank=8, alpha=16, scale=0.2)
    ref = AdapterRef("a", str(d), read_adapter(d, shapes).digest)
    if lora_kernel.load() is None:
        pytest.skip("the C LoRA delta does not build here")
    runner, layout = _runner(model)
    runner.adapters.acquire(ref)
    c = _logits(runner, layout, "c", IDS, ref.digest)
    monkeypatch.setattr(lora_kernel, "load", lambda: None)
    torch_path = _logits(runner, layout, "t", IDS, ref.digest)
    assert (c - torch_path).abs().max().item() < 1e-4
