"""The model runner's passes (bulkhead.engine.runner): a step's prompt chunks
share one pass only where every prompt kernel computes each row alone, and
then each row gets the numbers its own pass gave it."""

import pytest
import torch

from bulkhead.engine.builder import EngineConfig, build_engine, prompts_share_passes, single_thread_decode_rows
from bulkhead.engine.adapter_store import AdapterStore
from bulkhead.engine.runner import ModelRunner, RunnerConfig
from bulkhead.engine.scheduler import DecodeWork, PrefillWork, StepPlan
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.ledger import PageLedger
from bulkhead.kv.pool import KVPool
from bulkhead.model import bf16in_kernel, i16in_kernel, prefill_glue
from bulkhead.model.loader import load_model

needs_kernels = pytest.mark.skipif(
    bf16in_kernel.load() is None or i16in_kernel.load() is None or prefill_glue.load() is None,
    reason="no AVX-512 BF16 / VNNI here, or the C kernels cannot be built")


def run_step(model, batch_prompts: bool):
    """Three chunks in one step: two whole prompts and the last chunk of a
    third (its first chunk run before, alone). Returns (ids, logits, the
    pool's bytes, the number of passes)."""
    c = model.config
    pool, ledger = KVPool(KVLayout(c.num_layers, c.num_kv_heads, c.head_dim, 16, "bfloat16"), 40, "poison"), \
        PageLedger(40)
    runner = ModelRunner(model, pool, ledger, RunnerConfig(decode_row_multiple=1, batch_prompts=batch_prompts))
    pages = [tuple(ledger.allocate(f"r{i}", "t", 8)) for i in range(3)]
    third = list(range(3000, 3050))
    runner.run(StepPlan((PrefillWork("r2", "t", 0, tuple(third[:30]), pages[2], False),), (), ()))
    passes = []
    forward = model.forward
    model.forward = lambda batch, *a, **k: passes.append(len(batch.sequences)) or forward(batch, *a, **k)
    try:
        ids, logits = runner.run(StepPlan((PrefillWork("r0", "t", 0, tuple(range(100, 160)), pages[0], True),
                                           PrefillWork("r1", "t", 0, tuple(range(2000, 2017)), pages[1], True),
                                           PrefillWork("r2", "t", 30, tuple(third[30:]), pages[2], True)), (), ()))
    finally:
        model.forward = forward
    return ids, logits, pool.data.clone(), passes


@needs_kernels
def test_prompt_chunks_sharing_a_pass_get_the_numbers_their_own_passes_give(smollm2_dir):
    model = load_model(smollm2_dir, linear_kernel="q4-i16in", prefill_glue="c", prefill_attention="bf16")
    ids, logits, kv, passes = run_step(model, batch_prompts=True)
    alone_ids, alone_logits, alone_kv, alone_passes = run_step(model, batch_prompts=False)
    assert passes == [3] and alone_passes == [1, 1, 1]
    assert ids == alone_ids == ["r0", "r1", "r2"]
    assert torch.equal(logits, alone_logits)  # bit for bit: no row's numbers moved
    assert torch.equal(kv.isnan(), alone_kv.isnan()) and torch.equal(kv.nan_to_num(), alone_kv.nan_to_num())


def test_a_chunk_asking_for_every_rows_logits_keeps_a_pass_of_its_own():
    runner = ModelRunner.__new__(ModelRunner)
    runner.config, runner.page_size, runner.adapters = RunnerConfig(batch_prompts=True), 16, AdapterStore(None)
    a, b, c = (PrefillWork(f"r{i}", "t", 0, (1, 2), (i,), True, all_logits=(i == 1)) for i in range(3))
    assert runner._prefill_passes((a, b, c)) == [[a, c], [b]]
    runner.config = RunnerConfig()
    assert runner._prefill_passes((a, b, c)) == [[a], [b], [c]]
    with pytest.raises(ValueError, match="one chunk here"):
        runner._build_batch([a, c])
    runner.config = RunnerConfig(batch_prompts=True)  # a chunk wanting every row's logits never shares
    with pytest.raises(ValueError, match="one chunk here"):
        runner._build_batch([a, b])
    runner._build_batch([a, c])


def test_prompts_share_passes_only_beside_kernels_that_compute_each_row_alone():
    assert prompts_share_passes("q4-i16in", "q8-i16in", "c")
    assert prompts_share_passes("bf16", "bf16w", "c")
    # oneDNN's GEMM picks its reduction order by row count: a shared pass would move a row's numbers.
    assert not prompts_share_passes("onednn", "fp32", "c")
    assert not prompts_share_passes("q4", "bf16w", "c")  # q4's prompts run on oneDNN
    assert not prompts_share_passes("q4-i16in", "fp32", "c")  # an fp32 lm_head is oneDNN's
    assert not prompts_share_passes("q4-i16in", "q8-i16in", "torch")


@needs_kernels
@pytest.mark.parametrize("kernel, shares", [("auto", True), ("onednn", False)])
def test_the_builder_lets_prompts_share_a_pass_exactly_where_its_kernels_allow(smollm2_dir, kernel, shares):
    built = build_engine(EngineConfig(model_dir=smollm2_dir, model_id="m", kv_memory_bytes=16 * 2**20,
                                      context_length=512, linear_kernel=kernel, measure_decode_rows=False))
    # auto is q4-i16in here (needs_kernels): its prompt rows never meet a kernel that mixes rows.
    assert built.linear_kernel == ("q4-i16in" if kernel == "auto" else kernel)
    assert built.engine.runner.config.batch_prompts is shares


def decode_logits(runner, pages, rows: int):
    """One decode pass of the first `rows` requests, each with 40 tokens of
    KV in its pages (the pool's random values): (the torch threads the pass
    ran on, its logits)."""
    plan = StepPlan((), tuple(DecodeWork(f"d{i}", "t", 40, 500 + i, pages[i]) for i in range(rows)), ())
    seen, forward = [], runner.model.forward
    runner.model.forward = lambda *a, **k: seen.append(torch.get_num_threads()) or forward(*a, **k)
    try:
        with runner.threads_for(plan):  # as the engine holds it around a step's run and sampling
            return seen, runner.run(plan)[1]
    finally:
        runner.model.forward = forward


@needs_kernels
def test_a_lone_decode_row_runs_on_one_thread_and_gets_the_numbers_it_gets_beside_others(smollm2_dir):
    model = load_model(smollm2_dir, linear_kernel="q4-i16in", decode_attention="c", decode_glue="c", prefill_glue="c")
    c = model.config
    assert single_thread_decode_rows("q4-i16in", "q8-i16in", model.decode_glue) == 1
    pool, ledger = KVPool(KVLayout(c.num_layers, c.num_kv_heads, c.head_dim, 16, "bfloat16"), 40, "zero"), \
        PageLedger(40)
    pool.data.normal_(0, 1, generator=torch.Generator().manual_seed(0))
    runner = ModelRunner(model, pool, ledger, RunnerConfig(decode_row_multiple=1, single_thread_decode_rows=1))
    pages = [tuple(ledger.allocate(f"d{i}", "t", 3)) for i in range(3)]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        alone_threads, alone = decode_logits(runner, pages, 1)
        beside_threads, beside = decode_logits(runner, pages, 3)  # its row 0: the same token, position and KV
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
    assert alone_threads == [1] and beside_threads == [2] and after == 2
    assert torch.equal(alone[0], beside[0])  # bit for bit: running alone on one thread moved nothing


def test_only_kernels_whose_sums_ignore_the_thread_count_decode_a_lone_row_on_one_thread():
    assert single_thread_decode_rows("q4-i16in", "q8-i16in", "c") == 1
    assert single_thread_decode_rows("bf16", "bf16w", "c") == 1
    assert single_thread_decode_rows("onednn", "fp32", "c") == 0  # oneDNN may split a row's sums by thread
    assert single_thread_decode_rows("q4-i16in", "q8-i16in", "torch") == 0  # torch's glue: not shown invariant


def test_a_model_too_big_for_one_cores_bandwidth_decodes_a_lone_row_on_every_thread():
    from types import SimpleNamespace

    from bulkhead.engine.builder import layer_params

    smollm2 = SimpleNamespace(num_layers=30, hidden_size=576, head_dim=64, num_heads=9, num_kv_heads=3,
                              intermediate_size=1536)
    llama_1b = SimpleNamespace(num_layers=16, hidden_size=2048, head_dim=64, num_heads=32, num_kv_heads=8,
                               intermediate_size=8192)
    assert single_thread_decode_rows("q4-i16in", "q8-i16in", "c", layer_params(smollm2)) == 1
    assert single_thread_decode_rows("q4-i16in", "q8-i16in", "c", layer_params(llama_1b)) == 0
