"""who-read and request at the ledger: sequences built by hand, so each
read is known; the query must name every one that happened, and no other."""

import pytest

from bulkhead.kv.layout import KVLayout
from bulkhead.kv.ledger import PageLedger
from bulkhead.kv.pool import KVPool, release_unscrubbed, scrub_released
from bulkhead.kv.prefix_cache import CACHE_OWNER, PrefixCache
from bulkhead.lineage.query import request_story, who_read
from bulkhead.lineage.writer import LineageLog

KEY = bytes(range(32))


@pytest.fixture
def kv(tmp_path):
    log = LineageLog(tmp_path / "l.jsonl", KEY, flush_interval_s=3600)
    ledger = PageLedger(4, log)
    pool = KVPool(KVLayout(1, 1, 4, 4, "float32"), 4, "zero")
    pool.lineage = log
    yield ledger, pool, log
    log.close()


def query(log, tenant, **kw):
    log.flush()
    return [(r.request, r.tenant, r.page, r.scrubbed) for r in who_read([log.path], tenant, **kw)]


def test_a_page_reallocated_unscrubbed_is_named_with_its_reader(kv):
    ledger, pool, log = kv
    [page] = ledger.allocate("a1", "A", 1)
    ledger.release("a1")
    release_unscrubbed(ledger)  # the incident's allocator: freed pages keep their KV
    assert ledger.allocate("b1", "B", 1) == [page]  # newest freed first
    assert query(log, "A") == [("b1", "B", page, False)]
    assert query(log, "B") == []  # nobody was handed B's KV
    read = who_read([log.path], "A")[0]
    assert (read.held_by_request, read.held_at_generation, read.generation, read.via) == ("a1", 1, 2, "alloc")


def test_a_scrubbed_page_no_longer_holds_the_tenants_kv(kv):
    ledger, pool, log = kv
    [page] = ledger.allocate("a1", "A", 1)
    ledger.release("a1")
    scrub_released(pool, ledger)
    ledger.allocate("b1", "B", 1)
    assert query(log, "A") == []
    assert query(log, "A", include_scrubbed=True) == [("b1", "B", page, True)]


def test_kv_survives_several_unscrubbed_owners(kv):
    ledger, pool, log = kv
    [page] = ledger.allocate("a1", "A", 1)
    for rid, tenant in (("b1", "B"), ("c1", "C")):
        ledger.release(ledger.record(page).owner)
        release_unscrubbed(ledger)
        ledger.allocate(rid, tenant, 1)
    assert query(log, "A") == [("b1", "B", page, False), ("c1", "C", page, False)]
    assert query(log, "B") == [("c1", "C", page, False)]
    ledger.release("c1")
    scrub_released(pool, ledger)  # one scrub clears every tenant the page held
    ledger.allocate("d1", "D", 1)
    assert [r[0] for r in query(log, "A")] == ["b1", "c1"]


def test_own_tenant_and_since_filters(kv):
    ledger, pool, log = kv
    ledger.allocate("a1", "A", 1)
    ledger.release("a1")
    release_unscrubbed(ledger)
    ledger.allocate("a2", "A", 1)
    assert query(log, "A") == []
    assert [r[0] for r in query(log, "A", include_own=True)] == ["a2"]
    assert query(log, "A", include_own=True, since=4e9) == []


def test_prefix_cache_hits_name_the_reader(kv):
    ledger, pool, log = kv
    cache = PrefixCache(ledger)
    pages = ledger.allocate("a1", "A", 2)
    cache.insert("a1", "A", [11, 12], pages)
    ledger.release("a1") if ledger.pages_of("a1") else None
    assert cache.lookup("A", [11, 12], reader="a2") == pages
    assert query(log, "A") == []  # the tenant-scoped cache hands A's pages only to A
    assert sorted(r[0] for r in query(log, "A", include_own=True)) == ["a2", "a2"]
    cache.unpin(pages)
    cache.evict(2)
    scrub_released(pool, ledger)
    ledger.allocate("b1", "B", 2)
    assert query(log, "A") == []
    story = request_story([log.path], "a2")
    assert {s.via for s in story.pages.values()} == {"cache_hit"}
    assert [e["kind"] for e in story.pages[("l.jsonl", pages[0])].events][:3] == ["alloc", "donate", "cache_hit"]
    assert story.pages[("l.jsonl", pages[0])].events[1]["to"] == CACHE_OWNER


def test_request_tells_each_page_previous_holder_and_whether_it_was_scrubbed(kv):
    ledger, pool, log = kv
    a_pages = ledger.allocate("a1", "A", 2)
    ledger.release("a1")
    release_unscrubbed(ledger)
    b_pages = ledger.allocate("b1", "B", 3)
    log.request_end("b1", "B", "stop")
    ledger.release("b1")
    scrub_released(pool, ledger)
    log.flush()
    story = request_story([log.path], "b1").to_dict()
    assert story["tenant"] == "B"
    assert [r["kind"] for r in story["records"]] == ["alloc", "end", "free"]
    by_page = {p["page"]: p for p in story["pages"]}
    assert set(by_page) == set(b_pages)
    for p in a_pages:
        assert by_page[p]["previous_holder"] == {"request": "a1", "tenant": "A"}
        assert by_page[p]["scrubbed_before_handed"] is False
    [fresh] = set(b_pages) - set(a_pages)
    assert by_page[fresh]["previous_holder"] is None
    # From the previous holder's allocation to the request giving the page up.
    assert [e["kind"] for e in by_page[a_pages[0]]["history"]] == ["alloc", "free", "reusable", "alloc", "free"]
