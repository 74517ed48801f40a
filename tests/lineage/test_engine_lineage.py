"""The lineage log under a real engine (tiny random model): with the
incident's faults (legacy admission, no scrub: tests/faults) who-read names
exactly the cross-tenant reads that happened; with the real protocol, among
several tenants, none."""

import pytest
import torch

from bulkhead.engine.admission import admit
from bulkhead.engine.builder import EngineConfig, build_engine
from bulkhead.engine.request import SamplingParams
from bulkhead.lineage.query import request_story, who_read
from bulkhead.lineage.verify import EXIT_OK, verify
from bulkhead.lineage.writer import LineageLog
from tests.faults.harness import Faults, Injector
from tests.faults.legacy import LegacyTicket

KEY = bytes(range(32))


def prompt(n, seed):
    return torch.randint(3, 49000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def build(tiny_model_dir, tmp_path, seams=None, **cfg):
    log = LineageLog(tmp_path / "lineage.jsonl", KEY, flush_interval_s=3600, process="test")
    config = EngineConfig(model_dir=tiny_model_dir, model_id="tiny", kv_memory_bytes=8 * 2**20, **cfg)
    kwargs = {"seams": seams} if seams is not None else {}
    return build_engine(config, lineage=log, **kwargs), log


def run(built, admit_fn, rid, tenant, tokens, max_tokens=8):
    outs = []
    ticket = admit_fn(rid, tenant, tokens, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                      built.limits)
    built.engine.submit(ticket, outs.append)
    built.engine.run_until_idle()
    return ticket, outs


def test_with_the_incident_faults_who_read_names_exactly_the_stub_that_read_another_tenants_kv(
        tiny_model_dir, tmp_path):
    faults = tmp_path / "faults"
    faults.write_text("legacy_admission\nno_scrub\n")
    injector = Injector(Faults(str(faults)))
    built, log = build(tiny_model_dir, tmp_path, injector.seams(), context_length=64, scrub_mode="zero")
    run(built, injector._admit, "a1", "A", prompt(40, 1), max_tokens=20)  # 60 tokens: 4 pages of A's KV
    stub, _ = run(built, injector._admit, "b-over", "B", prompt(100, 2), max_tokens=2)  # over 64: the bug
    assert isinstance(stub, LegacyTicket) and injector.faults.fired["no_scrub"] >= 1  # the faults really fired
    log.flush()
    a_pages = sorted(p for (_, p), s in request_story([log.path], "a1").pages.items() if s.via == "alloc")
    assert len(a_pages) == 4
    reads = who_read([log.path], "A")
    assert sorted((r.request, r.tenant, r.page, r.scrubbed) for r in reads) == \
        [("b-over", "B", p, False) for p in a_pages]
    assert who_read([log.path], "B") == []
    assert verify(log.path, KEY).exit_code == EXIT_OK


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_with_the_real_protocol_and_several_tenants_who_read_names_none(tiny_model_dir, tmp_path, prefix_cache):
    built, log = build(tiny_model_dir, tmp_path, scrub_mode="poison", prefix_cache=prefix_cache)
    tenants = ["t0", "t1", "t2", "t3"]
    shared = prompt(40, 9)  # every tenant sends the same prefix: a cache shared across tenants would show
    outs = []
    for rnd in range(3):
        for i, t in enumerate(tenants):
            ticket = admit(f"{t}-{rnd}", t, shared + prompt(5 + i, rnd * 10 + i),
                           SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True), built.limits)
            built.engine.submit(ticket, outs.append)
        built.engine.run_until_idle()
    assert built.engine.stats.failures == 0
    log.flush()
    for t in tenants:
        assert who_read([log.path], t) == []
        # Not vacuous: other tenants were handed pages that had held t's KV, scrubbed in between.
        assert any(r.scrubbed for r in who_read([log.path], t, include_scrubbed=True))
    if prefix_cache:  # each tenant read its own cached pages, and only its own
        own = [r for t in tenants for r in who_read([log.path], t, include_own=True) if r.via == "cache_hit"]
        assert own and all(r.tenant == r.request.split("-")[0] for r in own)
    assert verify(log.path, KEY).exit_code == EXIT_OK
