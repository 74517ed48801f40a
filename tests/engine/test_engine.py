"""The engine over a tiny random model: real tensors, real pool, milliseconds."""

import pytest
import torch

from bulkhead.engine.admission import admit
from bulkhead.engine.request import SamplingParams
from bulkhead.errors import EngineFailure


class Collector:
    def __init__(self):
        self.outputs = {}

    def __call__(self, out):
        self.outputs.setdefault(out.request_id, []).append(out)

    def tokens(self, rid):
        return [t for o in self.outputs[rid] for t in o.token_ids]

    def final(self, rid):
        return self.outputs[rid][-1]


def submit(built, sink, rid, prompt, tenant="alpha", **params):
    params.setdefault("temperature", 0.0)
    params.setdefault("max_tokens", 12)
    ticket = admit(rid, tenant, prompt, SamplingParams(**params), built.limits)
    built.engine.submit(ticket, sink)


def prompts(n, length=20):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 49000, (length + 3 * i,), generator=g).tolist() for i in range(n)]


def swap_victim_page_into_thief_plan(engine) -> list:
    """Fault: from the next decode plan on (once), request "thief"'s page
    table names request "victim"'s first page. Returns the list that gets
    an entry when the fault fires."""
    from dataclasses import replace

    fired = []
    real_schedule = engine.scheduler.schedule

    def swap_pages():
        plan = real_schedule()
        if plan and plan.decode and not fired:
            victim_page = engine.ledger.pages_of("victim")[0]
            works = [replace(w, pages=(victim_page, *w.pages[1:])) if w.request_id == "thief" else w
                     for w in plan.decode]
            plan = replace(plan, decode=tuple(works))
            fired.append(1)
        return plan

    engine.scheduler.schedule = swap_pages
    return fired


def assert_clean(built):
    """Every page back in the pool, scrubbed (poison = NaN), ledger consistent."""
    e = built.engine
    e.check_integrity()
    assert e.ledger.num_free == e.ledger.num_pages
    if e.pool.scrub_mode == "poison":
        assert torch.isnan(e.pool.data).all()


def test_greedy_generation_finishes_and_returns_every_page(make_engine):
    built = make_engine()
    sink = Collector()
    submit(built, sink, "r1", prompts(1)[0], ignore_eos=True)
    built.engine.run_until_idle()
    final = sink.final("r1")
    assert final.finished and final.finish_reason == "length" and final.completion_tokens == 12
    assert len(sink.tokens("r1")) == 12
    assert built.engine.stats.failures == 0
    assert_clean(built)


def test_batched_output_equals_solo_output_token_for_token(make_engine):
    # The isolation oracle: a request's greedy tokens do not depend on who else
    # is in its batch. Poisoned pages make any stale read fail the step.
    built = make_engine()
    sink = Collector()
    ps = prompts(6)
    for i, p in enumerate(ps):
        submit(built, sink, f"solo{i}", p, max_tokens=24, ignore_eos=True)
        built.engine.run_until_idle()
    for i, p in enumerate(ps):
        submit(built, sink, f"batch{i}", p, tenant="alpha" if i % 2 else "beta", max_tokens=24, ignore_eos=True)
    built.engine.run_until_idle()
    for i in range(6):
        assert sink.tokens(f"batch{i}") == sink.tokens(f"solo{i}")
    assert built.engine.stats.failures == 0
    assert_clean(built)


def test_chunked_prefill_gives_the_same_tokens_as_one_pass(make_engine):
    whole, chunked = make_engine(), make_engine(prefill_chunk=7)
    p = prompts(1, length=40)[0]
    outs = []
    for built in (whole, chunked):
        sink = Collector()
        submit(built, sink, "r", p, max_tokens=8, ignore_eos=True)
        built.engine.run_until_idle()
        outs.append(sink.tokens("r"))
        assert_clean(built)
    assert outs[0] == outs[1]


def test_preemption_under_a_tight_pool_completes_everything(make_engine):
    from bulkhead.engine.builder import KV_DTYPE_AUTO
    from bulkhead.kv.layout import KVLayout

    # Room for ~4 sequences of 64 tokens; 8 requests each growing to 60.
    layout = KVLayout(2, 2, 16, 16, KV_DTYPE_AUTO)  # the engine's default KV dtype
    built = make_engine(kv_memory_bytes=layout.bytes_per_page * 16, context_length=256)
    sink = Collector()
    for i, p in enumerate(prompts(8, length=20)):
        submit(built, sink, f"r{i}", p, max_tokens=40, ignore_eos=True)
    built.engine.run_until_idle()
    assert built.engine.scheduler.num_preemptions > 0  # the pressure really happened
    for i in range(8):
        assert sink.final(f"r{i}").completion_tokens == 40
    assert built.engine.stats.failures == 0
    assert_clean(built)


@pytest.mark.parametrize("steps_before_abort", [0, 1, 3])
def test_abort_in_every_state_returns_pages_scrubbed(make_engine, steps_before_abort):
    built = make_engine(prefill_chunk=8)
    sink = Collector()
    submit(built, sink, "r", prompts(1, length=20)[0], max_tokens=50, ignore_eos=True)
    built.engine._take_commands(block=False)
    for _ in range(steps_before_abort):  # 0: waiting; 1: mid-prefill; 3: decoding
        built.engine.step()
    built.engine.abort("r")
    built.engine.run_until_idle()
    assert sink.final("r").finish_reason == "abort"
    assert_clean(built)


def test_a_page_of_another_request_in_a_plan_fails_closed(make_engine):
    built = make_engine()
    sink = Collector()
    engine = built.engine
    submit(built, sink, "victim", prompts(1)[0], max_tokens=30, ignore_eos=True, tenant="alpha")
    submit(built, sink, "thief", prompts(2)[1], max_tokens=30, ignore_eos=True, tenant="beta")
    for _ in range(3):
        engine._take_commands(block=False)
        engine.step()
    real_schedule = engine.scheduler.schedule
    fired = swap_victim_page_into_thief_plan(engine)
    engine.run_until_idle()
    assert fired, "the fault never fired"
    for rid in ("victim", "thief"):
        final = sink.final(rid)
        assert final.finish_reason == "error" and isinstance(final.error, EngineFailure)
    assert engine.stats.failures == 1
    assert_clean(built)
    # ... and the engine keeps serving.
    engine.scheduler.schedule = real_schedule
    submit(built, sink, "after", prompts(1)[0], max_tokens=4, ignore_eos=True)
    engine.run_until_idle()
    assert sink.final("after").finish_reason == "length"


def test_reading_unwritten_kv_fails_closed_in_poison_mode(make_engine):
    # A request whose watermark claims KV that was never written (the
    # incident's 1-token stub attended over N-1 unwritten pages) sees the
    # poison and is failed, not answered.
    built = make_engine()
    sink = Collector()
    engine = built.engine
    submit(built, sink, "r", prompts(1)[0], max_tokens=10, ignore_eos=True)
    engine._take_commands(block=False)
    engine.step()  # prefill
    req = engine.scheduler.requests["r"]
    engine.ledger.allocate("r", "alpha", 2)  # pages nobody wrote for r
    req.num_computed += 20  # the fault: watermark past what was written
    req.output_token_ids.extend([5] * 20)
    engine.run_until_idle()
    assert sink.final("r").finish_reason == "error"
    assert engine.stats.failures == 1
    assert_clean(built)


def test_seeded_sampling_is_reproducible_and_differs_across_seeds(make_engine):
    built = make_engine()
    sink = Collector()
    p = prompts(1)[0]
    for rid, seed in (("a", 1), ("b", 1), ("c", 2)):
        submit(built, sink, rid, p, temperature=1.0, top_p=0.9, top_k=50, seed=seed, max_tokens=16,
               ignore_eos=True)
        built.engine.run_until_idle()
    assert sink.tokens("a") == sink.tokens("b")
    assert sink.tokens("a") != sink.tokens("c")
    assert_clean(built)


def test_stop_token_ids_and_min_tokens(make_engine):
    built = make_engine()
    sink = Collector()
    p = prompts(1)[0]
    submit(built, sink, "free", p, max_tokens=10, ignore_eos=True)
    built.engine.run_until_idle()
    first = sink.tokens("free")[0]
    submit(built, sink, "stop", p, max_tokens=10, ignore_eos=True, stop_token_ids=(first,))
    submit(built, sink, "min", p, max_tokens=10, ignore_eos=True, stop_token_ids=(first,), min_tokens=3)
    built.engine.run_until_idle()
    assert sink.final("stop").finish_reason == "stop" and sink.final("stop").completion_tokens == 1
    assert first not in sink.tokens("min")[:3]
    assert sink.final("min").completion_tokens >= 3


def test_prefix_cache_reuses_a_tenants_pages_and_never_another_tenants(make_engine):
    built = make_engine(prefix_cache=True)
    sink = Collector()
    p = prompts(1, length=50)[0]
    cache = built.engine.scheduler.cache
    submit(built, sink, "a1", p, tenant="alpha", max_tokens=8, ignore_eos=True)
    built.engine.run_until_idle()
    submit(built, sink, "b1", p, tenant="beta", max_tokens=8, ignore_eos=True)
    built.engine.run_until_idle()
    assert cache.hits == 0  # same prompt, other tenant: computed again
    submit(built, sink, "a2", p, tenant="alpha", max_tokens=8, ignore_eos=True)
    built.engine.run_until_idle()
    assert cache.hits == 3  # 50 tokens: three whole pages of 16 reused
    assert built.engine.stats.failures == 0  # no poisoned read on the reused pages
    assert sink.tokens("a2") == sink.tokens("a1")
    built.engine.check_integrity()


def test_prefill_rows_are_padded_to_a_bucket_on_the_onednn_kernel(make_engine):
    # oneDNN caches a compiled kernel per row count: without buckets, prompts
    # of every length grow the process (bulkhead.engine.runner.RunnerConfig).
    from bulkhead.engine.builder import PREFILL_ROW_BUCKET, UNBUCKETED_KERNELS
    from bulkhead.engine.scheduler import PrefillWork

    built = make_engine()
    if built.linear_kernel in UNBUCKETED_KERNELS:
        pytest.skip(f"{built.linear_kernel} needs no buckets")
    runner = built.engine.runner
    assert runner.config.prefill_row_bucket == PREFILL_ROW_BUCKET == 32
    pages = tuple(built.engine.ledger.allocate("r", "alpha", 1))
    batch, ids = runner._build_batch([PrefillWork("r", "alpha", 0, tuple(range(100, 113)), pages, True)])
    assert batch.token_ids.shape[0] == 32  # 13 prompt rows, 19 padding rows
    assert batch.write_slots.shape[0] == 13 and batch.logit_rows.tolist() == [12] and ids == ["r"]
