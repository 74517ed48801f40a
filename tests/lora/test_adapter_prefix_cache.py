"""The prefix cache under adapters: KV computed under one set of weights is
never found by a request under another (the base model, another adapter),
because the adapter's digest is part of the cache salt
(kv/prefix_cache.tenant_salt). Tried: with the digest left out of the salt,
both tests here fail (shared chains; a cache hit across weights)."""

from dataclasses import replace

import pytest

from bulkhead.engine.admission import AdapterRef, Admitted, admit
from bulkhead.engine.request import SamplingParams
from bulkhead.engine.scheduler import Scheduler, SchedulerConfig
from bulkhead.kv.ledger import PageLedger
from bulkhead.kv.prefix_cache import CACHE_OWNER
from bulkhead.lora.peft_files import BaseShapes, read_adapter
from tests.engine.builders import complete_step
from bench.lora_adapters import write_adapter

PS = 4
PROMPT = tuple(range(100, 114))  # 14 tokens: 3 full pages can be cached (never the last token)
X = AdapterRef("sql", "/unused", "a" * 64)
Y = AdapterRef("chat", "/unused", "b" * 64)


def _scheduler() -> Scheduler:
    ledger = PageLedger(32)
    return Scheduler(SchedulerConfig(page_size=PS, prefix_cache=True), ledger,
                     reclaim=lambda: ledger.mark_scrubbed(ledger.dirty_pages()), cache_secret=b"k" * 32)


def _serve(s: Scheduler, rid: str, adapter: AdapterRef | None) -> int:
    """Serve one request of tenant alpha to the end; returns where its prefill started (12: three cached pages)."""
    s.add(Admitted(rid, "alpha", PROMPT, SamplingParams(max_tokens=2), 4096, None, adapter=adapter))
    start = None
    while s.has_work():
        plan = s.schedule()
        if start is None and plan.prefills:
            start = plan.prefills[0].start
        for w in (*plan.prefills, *plan.decode):
            s.ledger.check_readable(w.request_id, w.tenant, list(w.pages), CACHE_OWNER)
        complete_step(s, plan)
    return start


def test_one_tenants_prompt_under_the_base_model_and_two_adapters_has_three_disjoint_chains():
    s = _scheduler()
    chains = {}
    for rid, adapter in (("base", None), ("x", X), ("y", Y)):
        s.add(Admitted(rid, "alpha", PROMPT, SamplingParams(max_tokens=2), 4096, None, adapter=adapter))
        chains[rid] = set(s.requests[rid].prefix_hashes)
    assert all(len(c) == 3 for c in chains.values())
    assert not (chains["base"] & chains["x"]) and not (chains["base"] & chains["y"]) and not (chains["x"] & chains["y"])


def test_each_set_of_weights_misses_the_others_cache_and_hits_its_own():
    s = _scheduler()
    assert [_serve(s, rid, a) for rid, a in (("base", None), ("x", X), ("y", Y))] == [0, 0, 0]
    assert s.cache.hits == 0
    assert [_serve(s, rid, a) for rid, a in (("base2", None), ("x2", X), ("y2", Y))] == [12, 12, 12]


@pytest.fixture
def adapter(tiny_model_dir, tmp_path):
    from bulkhead.model.config import load_model_config

    shapes = BaseShapes.of(load_model_config(tiny_model_dir))
    d = write_adapter(tmp_path / "x", shapes, rank=8, alpha=16, seed=1, scale=0.5)
    return AdapterRef("sql", str(d), read_adapter(d, shapes).digest)


def _greedy(built, rid: str, prompt: list[int], adapter: AdapterRef | None) -> list[int]:
    out = []
    ticket = admit(rid, "alpha", prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
                   built.limits)
    built.engine.submit(replace(ticket, adapter=adapter), lambda o: out.extend(o.token_ids))
    built.engine.run_until_idle()
    return out


def test_the_base_models_cached_prefix_is_never_served_to_an_adapter_request(make_engine, adapter):
    prompt = list(range(1000, 1000 + 70))  # several full pages
    fresh = make_engine(prefix_cache=True)
    under_adapter = _greedy(fresh, "alone", prompt, adapter)
    built = make_engine(prefix_cache=True)
    base = _greedy(built, "base", prompt, None)
    cache = built.engine.scheduler.cache
    assert _greedy(built, "after-base", prompt, adapter) == under_adapter
    assert cache.hits == 0  # the base model's pages were there, and not read
    assert _greedy(built, "again", prompt, adapter) == under_adapter and cache.hits > 0  # its own pages are
    assert base != under_adapter  # other weights, other answer: a page served across them would show
    built.engine.check_integrity()
