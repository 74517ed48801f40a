"""A prompt pass's last layer, after its attention, runs only the rows whose
logits are wanted (bulkhead.model.llama.LlamaModel._last_layer_logit_rows),
and those rows get the numbers the whole pass gives them."""

import pytest
import torch

from bulkhead.engine.runner import ModelRunner, RunnerConfig
from bulkhead.engine.scheduler import PrefillWork, StepPlan
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.ledger import PageLedger
from bulkhead.kv.pool import KVPool
from bulkhead.model import bf16in_kernel, prefill_glue
from bulkhead.model.loader import load_model

needs_kernels = pytest.mark.skipif(bf16in_kernel.load() is None or prefill_glue.load() is None,
                                   reason="no AVX-512 BF16 here, or the C kernels cannot be built")

PROMPT = tuple(range(1000, 1040))


class RowCounter:
    """A linear layer that records how many rows each call gives it."""

    def __init__(self, inner):
        self.inner, self.rows = inner, []

    def __call__(self, x, b=None, decode=False):
        self.rows.append(x.shape[0])
        return self.inner(x, b, decode)


def prompt_logits(model, all_logits: bool):
    """The logits of one 40-token prompt's pass, its KV, and the rows the last layer's down projection ran."""
    c = model.config
    pool, ledger = KVPool(KVLayout(c.num_layers, c.num_kv_heads, c.head_dim, 16, "bfloat16"), 8, "poison"), \
        PageLedger(8)
    runner = ModelRunner(model, pool, ledger, RunnerConfig(decode_row_multiple=1))
    pages = tuple(ledger.allocate("r0", "t", 3))
    last = model.weights.layers[-1]
    down, last.down = last.down, RowCounter(last.down)
    try:
        _, logits = runner.run(StepPlan((PrefillWork("r0", "t", 0, PROMPT, pages, True, all_logits=all_logits),),
                                        (), ()))
        return logits, pool.data.clone(), last.down.rows
    finally:
        last.down = down


@needs_kernels
def test_the_last_layer_runs_only_the_sampling_row_and_gives_it_the_whole_pass_numbers(smollm2_dir):
    model = load_model(smollm2_dir, linear_kernel="q4-i16in", prefill_glue="c", prefill_attention="bf16")
    logits, kv, rows = prompt_logits(model, all_logits=False)
    every, every_kv, every_rows = prompt_logits(model, all_logits=True)
    assert rows == [1] and every_rows == [len(PROMPT)]
    assert torch.equal(logits[-1], every[-1])  # bit for bit
    assert torch.equal(kv.nan_to_num(), every_kv.nan_to_num())  # every row's K and V written, as before


def test_the_torch_glue_runs_the_last_layer_whole(smollm2_dir):
    # The exact path: its oneDNN matmuls' sums may depend on the row count, so its rows stay as they were.
    model = load_model(smollm2_dir, linear_kernel="onednn", prefill_glue="torch", prefill_attention="torch")
    _, _, rows = prompt_logits(model, all_logits=False)
    assert rows == [len(PROMPT)]


@needs_kernels
def test_a_chunk_that_wants_no_logits_skips_its_last_layers_tail_and_still_writes_its_kv(smollm2_dir):
    model = load_model(smollm2_dir, linear_kernel="q4-i16in", prefill_glue="c", prefill_attention="bf16")
    c = model.config
    pool, ledger = KVPool(KVLayout(c.num_layers, c.num_kv_heads, c.head_dim, 16, "bfloat16"), 8, "poison"), \
        PageLedger(8)
    runner = ModelRunner(model, pool, ledger, RunnerConfig(decode_row_multiple=1))
    pages = tuple(ledger.allocate("r0", "t", 3))
    last = model.weights.layers[-1]
    down, last.down = last.down, RowCounter(last.down)
    try:
        runner.run(StepPlan((PrefillWork("r0", "t", 0, PROMPT[:24], pages, False),), (), ()))
        _, logits = runner.run(StepPlan((PrefillWork("r0", "t", 24, PROMPT[24:], pages, True),), (), ()))
        rows = last.down.rows
    finally:
        last.down = down
    whole, whole_kv, _ = prompt_logits(model, all_logits=False)
    assert rows == [0, 1]  # the first chunk: no row; the second: its sampling row
    assert torch.equal(pool.data.nan_to_num(), whole_kv.nan_to_num())  # every position's K and V, every layer
    torch.testing.assert_close(logits, whole, rtol=0, atol=1e-3)  # chunked: the same model, within rounding
