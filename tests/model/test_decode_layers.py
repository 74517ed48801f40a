"""A decode step's layers in one C call (bulkhead.model.decode_layers): the
torch path's numbers, batch invariance, and refusing bad input before it
writes anything."""

import dataclasses

import pytest
import torch

from bulkhead.engine.runner import ModelRunner, RunnerConfig
from bulkhead.engine.scheduler import DecodeWork, PrefillWork, StepPlan
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.ledger import PageLedger
from bulkhead.kv.pool import KVPool
from bulkhead.model import bf16in_kernel, decode_kernel, decode_layers, i16in_kernel, q4_kernel
from bulkhead.model.decode_kernel import KernelError
from bulkhead.model.linear_kernel import onednn_usable
from bulkhead.model.llama import LlamaModel
from bulkhead.model.loader import load_model

pytestmark = pytest.mark.skipif(
    decode_layers.load() is None or q4_kernel.load() is None or decode_kernel.load(64, 3, 16) is None
    or not onednn_usable(torch.float32), reason="the C kernels cannot be built here")

PROMPTS = [list(range(100, 140)), list(range(300, 317)), list(range(1000, 1063))]


@pytest.fixture(scope="module")
def c_model(smollm2_dir):
    model = load_model(smollm2_dir, linear_kernel="q4", decode_attention="c", decode_glue="c")
    assert model.decode_glue == "c"
    return model


def torch_twin(model):
    """The same weights with the decode glue as torch ops."""
    twin = LlamaModel(model.config, model.weights, "c", "torch")
    assert twin.decode_glue == "torch"
    return twin


def prefilled(model, kv_dtype="bfloat16", prompts=PROMPTS):
    """A runner whose pool holds every prompt's KV; returns it and each request's DecodeWork."""
    c = model.config
    layout = KVLayout(c.num_layers, c.num_kv_heads, c.head_dim, 16, kv_dtype)
    pool, ledger = KVPool(layout, 32, "poison"), PageLedger(32)
    # Decode rows padded to a multiple, not tiled: the engine measures
    # multiple 1 for q4 (with tiles the model takes the torch path).
    runner = ModelRunner(model, pool, ledger, RunnerConfig(prefill_row_bucket=32, decode_row_multiple=1))
    works = []
    for i, ids in enumerate(prompts):
        pages = tuple(ledger.allocate(f"r{i}", "t", layout.pages_for_tokens(len(ids) + 4)))
        runner.run(StepPlan(PrefillWork(f"r{i}", "t", 0, tuple(ids[:-1]), pages, False), (), ()))
        works.append(DecodeWork(f"r{i}", "t", len(ids) - 1, ids[-1], pages))
    return runner, works


def same_bits(a, b) -> bool:
    """Equal bit for bit (a poisoned pool's NaN included)."""
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def decode(runner, works):
    return runner.run(StepPlan(None, tuple(works), ()))[1]


# Max |logit difference| allowed. Measured: 5e-5 with fp32 KV; 2.2e-3 with
# bf16 KV, where a last-bit difference can round a stored K or V the other
# way (KL between the two distributions ~5e-7 nats either way).
@pytest.mark.parametrize("kv_dtype,atol", [("float32", 2e-4), ("bfloat16", 1e-2)])
def test_it_computes_the_torch_paths_numbers(c_model, kv_dtype, atol):
    runner, works = prefilled(c_model, kv_dtype)
    before = runner.pool.data.clone()
    ours = decode(runner, works)
    ours_pool = runner.pool.data.clone()
    runner.pool.data.copy_(before)
    runner.model = torch_twin(c_model)
    theirs = decode(runner, works)
    # Two sums in another order (RMSNorm, SiLU's exp) over 30 layers: far
    # below what moves a token (logits here reach ~20).
    assert (ours - theirs).abs().max().item() < atol
    kl = torch.nn.functional.kl_div(ours.log_softmax(-1), theirs.log_softmax(-1), log_target=True, reduction="none")
    assert kl.sum(-1).max().item() < 1e-5
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert not same_bits(ours_pool, before)  # the step wrote its K and V
    changed = lambda pool: (pool.view(torch.uint8) != before.view(torch.uint8)).flatten(2).any(-1)  # noqa: E731
    assert torch.equal(changed(ours_pool), changed(runner.pool.data))  # into the same pages and layers


@pytest.mark.parametrize("kernel", [
    pytest.param("q4-i16in", marks=pytest.mark.skipif(bf16in_kernel.load() is None or i16in_kernel.load() is None,
                                                      reason="no AVX-512 BF16 or VNNI here"))])
def test_under_a_reduced_input_kernel_it_calls_that_twin_as_the_torch_path_does(smollm2_dir, c_model, kernel):
    model = load_model(smollm2_dir, linear_kernel=kernel, decode_attention="c", decode_glue="c")
    assert model.decode_glue == "c"
    runner, works = prefilled(model)
    before = runner.pool.data.clone()
    ours = decode(runner, works)

    def again(other):
        runner.pool.data.copy_(before)
        runner.model = other
        return decode(runner, works)

    theirs, fp32_inputs = again(torch_twin(model)), again(c_model)
    # The glue's two sums in another order move an input by its last bit,
    # which can round it to the other bf16 neighbour: logits move by up to
    # ~0.05 (measured 0.04), far below what moves a token.
    kl = torch.nn.functional.kl_div(ours.log_softmax(-1), theirs.log_softmax(-1), log_target=True, reduction="none")
    assert kl.sum(-1).max().item() < 1e-4 and torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert (ours - theirs).abs().max().item() < 0.1
    assert (ours - fp32_inputs).abs().max().item() > 1e-3  # not the q4 kernel's numbers
    runner.model = model
    for i, work in enumerate(works):  # and each request's numbers are its own
        runner.pool.data.copy_(before)
        assert torch.equal(decode(runner, [work])[0], ours[i]), i


def test_a_kv_cache_rounds_as_torch_rounds(c_model):
    # Layer 0's K and V depend only on the token: stored in bf16 they must be
    # the fp32 values rounded to nearest even, as torch's .to(bfloat16).
    fp32_runner, works = prefilled(c_model, "float32", PROMPTS[:1])
    bf16_runner, _ = prefilled(c_model, "bfloat16", PROMPTS[:1])
    decode(fp32_runner, works)
    decode(bf16_runner, works)
    page, offset = works[0].pages[works[0].position // 16], works[0].position % 16
    (k32, v32), (k16, v16) = fp32_runner.pool.layer_views()[0], bf16_runner.pool.layer_views()[0]
    assert torch.equal(k16[page, :, :, offset], k32[page, :, :, offset].bfloat16())
    assert torch.equal(v16[page, offset], v32[page, offset].bfloat16())


@pytest.mark.parametrize("threads", [1, 2])
def test_a_requests_numbers_do_not_depend_on_its_batch_mates(c_model, threads):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        runner, works = prefilled(c_model)
        before = runner.pool.data.clone()
        together = decode(runner, works)
        for i, work in enumerate(works):
            runner.pool.data.copy_(before)
            assert torch.equal(decode(runner, [work])[0], together[i]), i
    finally:
        torch.set_num_threads(previous)


def test_a_poisoned_position_it_reads_reaches_that_requests_logits_only(c_model):
    runner, works = prefilled(c_model)
    k, v = runner.pool.layer_views()[5]
    v[works[1].pages[0], 2] = float("nan")
    runner.config = dataclasses.replace(runner.config, safe_mode=False)  # see the NaN, not the runner's refusal
    logits = decode(runner, works)
    assert torch.isfinite(logits[0]).all() and torch.isfinite(logits[2]).all()
    assert not torch.isfinite(logits[1]).any()


def run_layers(model, runner, works, **changes):
    """One decode step straight through DecodeLayers, with the batch's fields changed."""
    batch, _ = runner._build_batch(list(works))
    batch = dataclasses.replace(batch, **changes)
    x = model.weights.embed[batch.token_ids]
    return model._c_layers.run(x, batch, runner._layers)


def _bad_slot(runner, batch, value):
    slots = batch.write_slots.clone()
    slots[2] = value
    return {"write_slots": slots}


def _bad_position(runner, batch, value):
    positions = batch.positions.clone()
    positions[0] = value
    return {"positions": positions}


@pytest.mark.parametrize("change,value,message", [
    (_bad_slot, lambda runner, model: -1, "a write slot outside the pool"),  # C's -1 / 16 would be page 0
    (_bad_slot, lambda runner, model: runner.pool.num_pages * 16, "a write slot outside the pool"),  # one page past
    (_bad_position, lambda runner, model: model.cos.shape[0], "a position outside the rotary tables"),
], ids=["slot -1", "slot past the pool", "position past the tables"])
def test_a_bad_slot_or_position_is_refused_before_anything_is_written(c_model, change, value, message):
    runner, works = prefilled(c_model)
    batch, _ = runner._build_batch(list(works))
    before = runner.pool.data.clone()
    with pytest.raises(KernelError, match=message):
        run_layers(c_model, runner, works, **change(runner, batch, value(runner, c_model)))
    assert same_bits(runner.pool.data, before)


@pytest.mark.parametrize("field", ["decode_page_offset", "write_slots"])
def test_index_tensors_shorter_than_the_requests_are_refused_before_anything_is_written(c_model, field):
    # C reads one page offset and one write slot per request: past a short
    # tensor's end it would read memory that names some other page.
    runner, works = prefilled(c_model)
    batch, _ = runner._build_batch(list(works))
    before = runner.pool.data.clone()
    with pytest.raises(KernelError, match="one write slot and page offset per request"):
        run_layers(c_model, runner, works, **{field: getattr(batch, field)[:-1].clone()})
    assert same_bits(runner.pool.data, before)


def test_a_page_list_past_the_pool_is_refused_by_attention(c_model):
    runner, works = prefilled(c_model)
    batch, _ = runner._build_batch(list(works))
    pages = batch.pages.clone()
    pages[-1] = runner.pool.num_pages
    with pytest.raises(KernelError, match="decode row 2's page list"):
        run_layers(c_model, runner, works, pages=pages)


def test_it_runs_only_over_the_4_bit_kernel_and_c_attention(smollm2_dir, c_model):
    assert LlamaModel(c_model.config, c_model.weights, "torch").decode_glue == "torch"  # torch attention
    exact = load_model(smollm2_dir, linear_kernel="onednn", decode_attention="c")
    assert exact.decode_glue == "torch"  # fp32 oneDNN weights: the exact model's path
    with pytest.raises(RuntimeError, match="decode glue c cannot run: the linear layers do not run the q4 kernel"):
        LlamaModel(exact.config, exact.weights, "c", "c")
    with pytest.raises(ValueError, match="decode glue must be one of"):
        LlamaModel(c_model.config, c_model.weights, "c", "fast")


def test_weights_that_mix_decode_kernels_are_refused(c_model, monkeypatch):
    # The C layers call one kernel for every matmul: a layer whose Q4Linear
    # asks for the other would silently run the first one's numbers.
    other = "bf16" if c_model.weights.layers[0].qkv.decode_inputs != "bf16" else "fp32"
    monkeypatch.setattr(c_model.weights.layers[3].down, "decode_inputs", other)
    with pytest.raises(RuntimeError, match="decode glue c cannot run: the linear layers mix decode kernels"):
        LlamaModel(c_model.config, c_model.weights, "c", "c")


def test_where_decode_rows_are_tiled_the_torch_path_runs(c_model, monkeypatch):
    # Tiles mean no batch-invariant row multiple was measured: the C layers,
    # one matmul over every row, must not run then.
    runner, works = prefilled(c_model)
    batch, _ = runner._build_batch(list(works))
    assert batch.row_tile == 0
    calls = []
    monkeypatch.setattr(c_model._c_layers, "run", lambda *a: calls.append(a) or a[0])
    c_model.forward(dataclasses.replace(batch, row_tile=2), runner._layers)
    assert calls == []
    c_model.forward(batch, runner._layers)
    assert len(calls) == 1


def test_after_the_c_layers_the_final_norm_is_the_c_glues(c_model, monkeypatch):
    # torch's F.rms_norm after a pass that streamed the weights cost ~200 us
    # against ~75 for the C glue's (docs/performance.md): it must not run.
    runner, works = prefilled(c_model)
    monkeypatch.setattr(torch.nn.functional, "rms_norm",
                        lambda *a, **k: pytest.fail("torch's RMSNorm ran after the C decode layers"))
    ours = decode(runner, works)
    monkeypatch.undo()
    assert torch.isfinite(ours).all()
    assert ours.shape == (len(works), c_model.config.vocab_size)


def test_a_pool_of_another_geometry_is_refused_before_anything_is_written(c_model):
    runner, works = prefilled(c_model)
    before = runner.pool.data.clone()
    batch, _ = runner._build_batch(list(works))
    x = c_model.weights.embed[batch.token_ids]
    with pytest.raises(KernelError, match="29 pool layers for a model of 30"):
        c_model._c_layers.run(x, batch, runner._layers[:-1])
    # A whole pool, its pages contiguous, laid out for head_dim 32: only the
    # shape check stands between it and writes sized for the model's 64.
    c = c_model.config
    other = KVPool(KVLayout(c.num_layers, c.num_kv_heads, 32, 16, "bfloat16"), runner.pool.num_pages, "poison")
    with pytest.raises(KernelError, match="K pages"):
        c_model._c_layers.run(x, batch, other.layer_views())
    assert same_bits(runner.pool.data, before)
