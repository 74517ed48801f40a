"""Adapter rows inside the C decode layers (bulkhead.model.lora_layers,
csrc/lora_delta.c's lora_layer_delta called from csrc/decode_layers.c):
the step stays in C, a row's numbers do not depend on its batch, and they
agree with the torch glue's and with the exact path's."""

import dataclasses

import pytest
import torch

from bench.lora_adapters import write_adapter
from bulkhead.engine.adapter_store import AdapterStore
from bulkhead.engine.admission import AdapterRef
from bulkhead.engine.runner import ModelRunner, RunnerConfig
from bulkhead.engine.step_plan import DecodeWork, PrefillWork, StepPlan
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.ledger import PageLedger
from bulkhead.kv.pool import KVPool
from bulkhead.lora import products as lora_products
from bulkhead.lora.peft_files import BaseShapes, read_adapter
from bulkhead.model import decode_kernel, decode_layers, lora_layers, q4_kernel
from bulkhead.model.linear_kernel import onednn_usable
from bulkhead.model.llama import LlamaModel
from bulkhead.model.lora_rows import LoraRows
from bulkhead.model.loader import load_model

pytestmark = pytest.mark.skipif(
    decode_layers.load() is None or q4_kernel.load() is None or decode_kernel.load(64, 3, 16) is None
    or lora_layers.load() is None or not onednn_usable(torch.float32), reason="the C kernels cannot be built here")

PROMPTS = [list(range(100, 140)), list(range(300, 317)), list(range(1000, 1063)), list(range(2000, 2025))]


@pytest.fixture(scope="module")
def c_model(smollm2_dir):
    model = load_model(smollm2_dir, linear_kernel="q4", decode_attention="c", decode_glue="c")
    assert model.decode_glue == "c"
    return model


@pytest.fixture(params=["int8", "bf16", "fp32"])
def products(request, monkeypatch):
    """The delta's arithmetic (bulkhead.model.lora_layers.products): int8
    weights where the CPU has AVX-512 VNNI (the default), bf16 products
    where it has AVX-512 BF16, fp32 products anywhere, as
    BULKHEAD_LORA_PRODUCTS asks."""
    monkeypatch.setenv(lora_products.ENV, request.param)
    if lora_layers.products() != request.param:
        pytest.skip(f"no {request.param} products on this CPU")
    return request.param


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, c_model):
    """Rank 16 on all seven linears, as bench/lora.py's: two stored in bf16 (PEFT's usual dtype), one in fp32."""
    shapes, root = BaseShapes.of(c_model.config), tmp_path_factory.mktemp("adapters")
    refs = []
    for i, dtype in enumerate((torch.bfloat16, torch.bfloat16, torch.float32)):
        d = write_adapter(root / f"a{i}", shapes, rank=16, alpha=32, seed=i, scale=0.02, dtype=dtype)
        refs.append(AdapterRef(f"a{i}", str(d), read_adapter(d, shapes).digest))
    return refs


def prefilled(model, refs, row_adapters, kv_dtype="float32"):
    """A runner whose pool holds each prompt's KV under its adapter (index into refs, or None for the base
    model); returns it and each request's next DecodeWork."""
    c = model.config
    layout = KVLayout(c.num_layers, c.num_kv_heads, c.head_dim, 16, kv_dtype)
    runner = ModelRunner(model, KVPool(layout, 48, "poison"), PageLedger(48),
                         RunnerConfig(prefill_row_bucket=32, decode_row_multiple=1))
    for ref in refs:
        runner.adapters.acquire(ref)
    works = []
    for i, (ids, a) in enumerate(zip(PROMPTS, row_adapters)):
        digest = None if a is None else refs[a].digest
        pages = tuple(runner.ledger.allocate(f"r{i}", "t", layout.pages_for_tokens(len(ids) + 4)))
        runner.run(StepPlan(PrefillWork(f"r{i}", "t", 0, tuple(ids[:-1]), pages, False, adapter=digest), (), ()))
        works.append(DecodeWork(f"r{i}", "t", len(ids) - 1, ids[-1], pages, digest))
    return runner, works


def decode(runner, works):
    return runner.run(StepPlan(None, tuple(works), ()))[1]


def c_steps_with_adapters(model, monkeypatch) -> list:
    """Records each C decode-layer step that carried adapter rows."""
    calls, run = [], model._c_layers.run

    def recorded(x, batch, kv_layers):
        calls.append(batch.lora is not None)
        return run(x, batch, kv_layers)

    monkeypatch.setattr(model._c_layers, "run", recorded)
    return calls


@pytest.mark.parametrize("threads", [1, 2])
def test_an_adapter_row_gets_the_same_numbers_alone_beside_base_rows_and_beside_other_adapters(
        c_model, adapters, monkeypatch, threads, products):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        runner, works = prefilled(c_model, adapters, [0, None, 1, 0])
        calls = c_steps_with_adapters(c_model, monkeypatch)
        before = runner.pool.data.clone()
        together = decode(runner, works)
        for i, work in enumerate(works):
            runner.pool.data.copy_(before)
            assert torch.equal(decode(runner, [work])[0], together[i]), i
        assert calls == [True, True, False, True, True]  # every step with an adapter row stayed in C
    finally:
        torch.set_num_threads(previous)


# Max |logit difference| against the torch glue on the same weights (logits
# reach ~20). With fp32 products, adapters stored in bf16 pack exactly: only
# the glue's two sums differ (the base model's bound in test_decode_layers,
# measured 5e-5 with fp32 KV). Stored in fp32, the C layers read them
# rounded to bf16 and the torch glue does not: measured 1.5e-3 at rank 16.
# bf16 products round each row's x and u = A x to bf16 too: measured 1.2e-3
# and 1.9e-3 on a decode step, 2.9e-3 and 3.9e-3 on a prompt's last row.
# int8 weights (the default with AVX-512 VNNI) are within half a step of
# max |w| / 127 per rank: measured 1.3e-2 and 5.7e-3 on a decode step,
# 1.7e-2 and 1.1e-2 on a prompt's last row (docs/adapters.md, "Bounds").
BOUNDS = {("fp32", 0): 2e-4, ("fp32", 2): 1e-2, ("bf16", 0): 1e-2, ("bf16", 2): 1e-2, ("int8", 0): 3e-2,
          ("int8", 2): 3e-2}


@pytest.mark.parametrize("adapter", [0, 2])
def test_the_c_layers_agree_with_the_torch_glue_and_apply_the_delta(c_model, adapters, monkeypatch, adapter,
                                                                    products):
    atol = BOUNDS[(products, adapter)]
    runner, works = prefilled(c_model, adapters, [adapter, None, adapter])
    calls = c_steps_with_adapters(c_model, monkeypatch)
    before = runner.pool.data.clone()
    ours = decode(runner, works)
    runner.pool.data.copy_(before)
    runner.model = LlamaModel(c_model.config, c_model.weights, "c", "torch")
    runner.adapters = AdapterStore(c_model.config)  # the torch glue reads the fp32 copy the C model's store let go
    runner.adapters.acquire(adapters[adapter])
    theirs = decode(runner, works)
    assert calls == [True]
    assert (ours - theirs).abs().max().item() < atol
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    # Without its delta an adapter row would be the base model's: far outside
    # the bound (measured ~1 at rank 16, scale 0.02).
    runner.pool.data.copy_(before)
    runner.model = c_model
    base = decode(runner, [dataclasses.replace(w, adapter=None) for w in works])
    assert (ours[0] - base[0]).abs().max().item() > 10 * atol
    assert torch.equal(ours[1], base[1])  # the base row is untouched


def test_the_c_layers_agree_with_the_exact_path_within_the_fast_paths_bound(smollm2_dir, c_model, adapters,
                                                                            products):
    """The exact path (aten weights, fp32 deltas through torch glue) equals
    transformers with the adapter merged (tests/lora/test_lora_model.py);
    the C layers with adapter rows stay within the fast path's bound
    against it (docs/performance.md: mean KL <= 1e-3 nats), as the base
    model's fast path does, and far from the exact path without the delta."""
    exact = load_model(smollm2_dir, linear_kernel="aten", decode_attention="torch", decode_glue="torch")
    kl_mean = {}
    for label, model, adapter in (("c", c_model, 0), ("c, delta skipped", c_model, None), ("exact", exact, 0)):
        runner, works = prefilled(model, adapters, [adapter] * 4)
        kl_mean[label] = decode(runner, works)
    ref = kl_mean.pop("exact").log_softmax(-1)
    kl = {k: torch.nn.functional.kl_div(v.log_softmax(-1), ref, log_target=True, reduction="none").sum(-1).mean().item()
          for k, v in kl_mean.items()}
    assert kl["c"] <= 1e-3, kl  # measured 3.9e-5 (fp32 products), 4.0e-5 (bf16) and 4.2e-5 (int8)
    assert kl["c, delta skipped"] > 1e-3, kl  # measured 1.7e-2: the bound tells a skipped delta


@pytest.mark.parametrize("adapter", [0, 2])
def test_a_prompt_under_an_adapter_takes_the_same_c_delta_and_agrees_with_the_torch_glue(
        c_model, adapters, monkeypatch, adapter, products):
    """A prompt pass's rows go through lora_layer_delta over the packed
    weights too (bulkhead.model.llama's _adapter_deltas), not per-module
    torch matmuls; the bounds are the decode step's, for the same reasons."""
    calls, add = [], lora_layers.StepDeltas.add
    monkeypatch.setattr(lora_layers.StepDeltas, "add", lambda self, *a: (calls.append(a[1]), add(self, *a))[1])

    def first_logits(model, digest):
        runner, _ = prefilled(model, adapters, [])
        pages = tuple(runner.ledger.allocate("p", "t", 3))
        return runner.run(StepPlan(PrefillWork("p", "t", 0, tuple(PROMPTS[0]), pages, True, adapter=digest),
                                   (), ()))[1][0]

    ours = first_logits(c_model, adapters[adapter].digest)
    assert len(calls) == 4 * c_model.config.num_layers  # qkv, o, gate_up and down of every layer
    theirs = first_logits(LlamaModel(c_model.config, c_model.weights, "c", "torch", c_model.prefill_attention,
                                     c_model.prefill_glue), adapters[adapter].digest)
    base = first_logits(c_model, None)
    atol = BOUNDS[(products, adapter)]
    assert (ours - theirs).abs().max().item() < atol
    assert (ours - base).abs().max().item() > 10 * atol


def test_a_worker_on_the_c_layers_holds_each_adapter_once_packed(c_model, adapters, products):
    """Every pass of a model whose C layers run adapter rows reads the packed
    bf16 copy, so its store keeps only that (before: the fp32 copy as well,
    twice the bytes), and the fp32 path refuses such weights loudly."""
    runner, works = prefilled(c_model, adapters, [0, None, 0])
    weights = runner.adapters.get(adapters[0].digest)
    assert not weights.fp32 and weights.nbytes == 0
    assert runner.adapters.held[adapters[0].digest] == weights.packed[0].nbytes > 0
    assert weights.packed[0].products == products
    assert decode(runner, works).isfinite().all()
    with pytest.raises(decode_kernel.KernelError, match="only packed"):
        LoraRows.of([weights]).add(0, "o", torch.zeros(1, c_model.config.q_size),
                                   torch.zeros(1, c_model.config.hidden_size))
    exact = AdapterStore(c_model.config).acquire(adapters[0])  # a store without the model's packing: fp32
    assert exact.fp32 and exact.nbytes > 0 and not exact.packed


def test_a_decode_step_on_the_same_adapter_rows_as_the_last_reuses_its_c_tables(c_model, adapters, monkeypatch,
                                                                              products):
    """One client on one adapter decodes with the same grouping every step:
    the C call's tables and scratch are built once and reused
    (lora_layers.step_deltas), with the numbers of a fresh build, bit for
    bit; a step whose grouping differs builds its own."""
    built, init = [], lora_layers.StepDeltas.__init__
    monkeypatch.setattr(lora_layers.StepDeltas, "__init__", lambda self, *a: (built.append(1), init(self, *a))[1])
    runner, works = prefilled(c_model, adapters, [0, 1])
    before = runner.pool.data.clone()
    first = decode(runner, works[:1])
    built.clear()
    for _ in range(3):
        runner.pool.data.copy_(before)
        again = decode(runner, works[:1])
        assert torch.equal(again, first)
    assert built == []  # the same rows under the same adapter: the first step's tables
    runner.pool.data.copy_(before)
    decode(runner, works[1:])  # the same row under another adapter
    runner.pool.data.copy_(before)
    decode(runner, works)  # two adapters
    assert len(built) == 2
    runner.pool.data.copy_(before)
    assert torch.equal(decode(runner, works[:1]), first)
