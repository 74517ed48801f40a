"""The tenant-scoped prefix cache with the scheduler and ledger: no model."""

import pytest

from bulkhead.engine.admission import Admitted
from bulkhead.engine.request import SamplingParams
from bulkhead.engine.scheduler import Scheduler, SchedulerConfig
from bulkhead.kv.ledger import LedgerError, PageLedger
from bulkhead.kv.prefix_cache import CACHE_OWNER, page_hashes, tenant_salt
from tests.engine.builders import complete_step

PS = 4
PROMPT = tuple(range(100, 114))  # 14 tokens: 3 full pages can be cached (never the last token)


def make(num_pages=32):
    ledger = PageLedger(num_pages)
    return Scheduler(SchedulerConfig(page_size=PS, prefix_cache=True), ledger,
                     reclaim=lambda: ledger.mark_scrubbed(ledger.dirty_pages()), cache_secret=b"k" * 32)


def run(s, rid, tenant="alpha", prompt=PROMPT, salt=None, max_tokens=2):
    """Serve one request to the end; returns its first prefill plan."""
    s.add(Admitted(rid, tenant, prompt, SamplingParams(max_tokens=max_tokens), 4096, salt))
    first = None
    while s.has_work():
        plan = s.schedule()
        if first is None:
            first = plan.prefills[0] if plan.prefills else None
        works = [*plan.prefills, *plan.decode]
        for w in works:  # what the runner checks on every step
            s.ledger.check_readable(w.request_id, w.tenant, list(w.pages), CACHE_OWNER)
        complete_step(s, plan)
    return first


def test_same_tenant_hits():
    s = make()
    assert run(s, "a1").start == 0
    second = run(s, "a2")
    assert second.start == 12  # three cached pages, only the tail computed
    assert s.cache.hits == 3


def test_another_tenant_misses_the_same_prompt():
    s = make()
    run(s, "a1", tenant="alpha")
    assert run(s, "b1", tenant="beta").start == 0
    assert s.cache.hits == 0


def test_a_client_salt_only_subdivides_its_own_tenant():
    s = make()
    run(s, "a1", tenant="alpha", salt="team-1")
    assert run(s, "a2", tenant="alpha", salt="team-2").start == 0  # other salt: miss
    assert run(s, "a3", tenant="alpha", salt="team-1").start == 12  # same salt: hit
    assert run(s, "b1", tenant="beta", salt="team-1").start == 0  # same salt, other tenant: miss


def test_keys_start_from_a_server_side_tenant_salt():
    a = page_hashes(tenant_salt(b"s", "alpha"), list(PROMPT), PS)
    b = page_hashes(tenant_salt(b"s", "beta"), list(PROMPT), PS)
    assert len(a) == 3 and not set(a) & set(b)
    assert page_hashes(tenant_salt(b"other-server", "alpha"), list(PROMPT), PS) != a


def test_a_cache_page_of_another_tenant_is_refused_by_the_ownership_check():
    s = make()
    run(s, "a1", tenant="alpha")
    alpha_page = s.ledger.pages_of(CACHE_OWNER)[0]
    s.ledger.allocate("b1", "beta", 1)
    with pytest.raises(LedgerError, match="owned by <prefix-cache>"):
        s.ledger.check_readable("b1", "beta", [alpha_page], CACHE_OWNER)
    s.ledger.check_readable("a9", "alpha", [alpha_page], CACHE_OWNER)


def test_unpinned_cache_pages_are_evicted_when_the_pool_runs_out():
    s = make(num_pages=8)
    run(s, "a1", prompt=tuple(range(200, 214)))  # leaves 3 cached pages
    assert s.cache.num_pages == 3
    run(s, "a2", prompt=tuple(range(300, 314)), max_tokens=12)  # needs 7 pages of 8
    assert s.cache.evictions >= 2  # a1's pages made room, then a2's prompt pages were cached
    assert s.ledger.num_free + s.ledger.num_owned == 8
    s.check_integrity()
