import pytest

from bulkhead.kv.ledger import LedgerError, OutOfPages, PageLedger
from bulkhead.kv.prefix_cache import CACHE_OWNER


def test_allocate_records_owner_tenant_and_bumps_generation():
    ledger = PageLedger(4)
    pages = ledger.allocate("r1", "alpha", 2)
    assert len(pages) == 2
    for p in pages:
        rec = ledger.record(p)
        assert (rec.owner, rec.tenant, rec.generation, rec.dirty) == ("r1", "alpha", 1, False)
    ledger.check_integrity({"r1"})


def test_generation_bumps_on_every_reuse():
    ledger = PageLedger(1)
    for gen in (1, 2, 3):
        [p] = ledger.allocate(f"r{gen}", "t", 1)
        assert ledger.generation(p) == gen
        ledger.mark_scrubbed(ledger.release(f"r{gen}"))


def test_released_pages_are_not_reusable_until_scrubbed():
    ledger = PageLedger(2)
    ledger.allocate("r1", "alpha", 2)
    freed = ledger.release("r1")
    assert ledger.num_free == 0 and ledger.num_dirty == 2
    with pytest.raises(OutOfPages):
        ledger.allocate("r2", "beta", 1)
    ledger.mark_scrubbed(freed)
    assert ledger.allocate("r2", "beta", 1)
    ledger.check_integrity({"r2"})


def test_newest_freed_page_is_reused_first():
    # Like the incident's allocator: the worst case for stale reads.
    ledger = PageLedger(4)
    [a] = ledger.allocate("r1", "alpha", 1)
    ledger.mark_scrubbed(ledger.release("r1"))
    assert ledger.allocate("r2", "beta", 1) == [a]


def test_double_free_is_refused():
    ledger = PageLedger(2)
    ledger.allocate("r1", "t", 1)
    ledger.release("r1")
    with pytest.raises(LedgerError, match="double free"):
        ledger.release("r1")


def test_use_after_free_is_refused():
    ledger = PageLedger(2)
    pages = ledger.allocate("r1", "t", 2)
    ledger.check_readable("r1", "t", pages, CACHE_OWNER)
    ledger.release("r1")
    with pytest.raises(LedgerError, match="owned by None"):
        ledger.check_readable("r1", "t", pages, CACHE_OWNER)


def test_page_of_another_request_is_refused():
    ledger = PageLedger(2)
    [a] = ledger.allocate("r1", "alpha", 1)
    ledger.allocate("r2", "beta", 1)
    with pytest.raises(LedgerError, match="owned by r1"):
        ledger.check_readable("r2", "beta", [a], CACHE_OWNER)


def test_a_request_cannot_change_tenant():
    ledger = PageLedger(2)
    ledger.allocate("r1", "alpha", 1)
    with pytest.raises(LedgerError, match="tenant"):
        ledger.allocate("r1", "beta", 1)


def test_scrubbing_a_page_that_is_not_dirty_is_refused():
    ledger = PageLedger(2)
    [p] = ledger.allocate("r1", "t", 1)
    with pytest.raises(LedgerError):
        ledger.mark_scrubbed([p])


def test_integrity_catches_owner_that_is_not_alive():
    ledger = PageLedger(2)
    ledger.allocate("ghost", "t", 1)
    with pytest.raises(LedgerError, match="not alive"):
        ledger.check_integrity(live_requests=set())


def test_integrity_catches_a_leaked_page():
    ledger = PageLedger(3)
    ledger._free.pop()  # simulate a bug that drops a page on the floor
    with pytest.raises(LedgerError, match="leaked"):
        ledger.check_integrity()


def test_integrity_catches_a_page_both_free_and_owned():
    ledger = PageLedger(3)
    [p] = ledger.allocate("r1", "t", 1)
    ledger._free.append(p)
    with pytest.raises(LedgerError, match="still names owner r1"):
        ledger.check_integrity({"r1"})


def test_owned_by_tenant_counts():
    ledger = PageLedger(8)
    ledger.allocate("r1", "alpha", 2)
    ledger.allocate("r2", "alpha", 1)
    ledger.allocate("r3", "beta", 3)
    assert ledger.owned_by_tenant() == {"alpha": 3, "beta": 3}
    assert ledger.num_owned == 6 and ledger.num_free == 2
