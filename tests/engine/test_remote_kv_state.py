"""Pages held for a KV transfer live in the scheduler, in one of two states
check_integrity() covers: a prefill hand-over (kept) and decode's
WAITING_FOR_REMOTE_KV reservation. No torch."""

import pytest

from bulkhead.engine.request import FinishReason
from bulkhead.kv.ledger import LedgerError, OutOfPages
from tests.engine.builders import FAKE_TOKEN, complete_step, ticket
from tests.engine.test_scheduler import make as make_scheduler


def test_a_reservation_waits_for_remote_kv_then_decodes():
    s = make_scheduler(num_pages=8)
    pages = s.reserve_for_remote_kv("r1", "alpha", 2)
    assert s.awaiting_remote_kv == {"r1": "alpha"} and s.ledger.pages_of("r1") == pages
    s.check_integrity()
    assert not s.has_work()  # nothing to schedule until the KV is verified
    req = s.add_prefilled(ticket("r1", prompt_len=8), FAKE_TOKEN)  # 2 pages of 4 tokens
    assert s.awaiting_remote_kv == {} and req in s.running
    s.check_integrity()
    complete_step(s, s.schedule())


def test_a_reservation_released_before_its_kv_frees_every_page():
    s = make_scheduler(num_pages=8)
    s.reserve_for_remote_kv("r1", "alpha", 3)
    assert s.release_reserved("r1") and s.awaiting_remote_kv == {}
    assert s.ledger.num_dirty == 3
    assert not s.release_reserved("r1")  # nothing twice
    s.ledger.mark_scrubbed(s.ledger.dirty_pages())
    s.check_integrity()


def test_a_short_pool_refuses_a_reservation_and_keeps_no_state():
    s = make_scheduler(num_pages=2)
    with pytest.raises(OutOfPages):
        s.reserve_for_remote_kv("r1", "alpha", 3)
    assert s.awaiting_remote_kv == {}
    s.check_integrity()


def test_the_integrity_check_sees_reserved_pages_nobody_accounts_for():
    # Forget the state (as a reservation tracked anywhere else could be) and
    # the pages are owned by a request the scheduler does not know: a leak.
    s = make_scheduler(num_pages=8)
    s.reserve_for_remote_kv("r1", "alpha", 2)
    s.awaiting_remote_kv.clear()
    with pytest.raises(LedgerError, match="not alive"):
        s.check_integrity()


def test_a_prefill_hand_over_is_kept_until_released():
    s = make_scheduler(num_pages=8)
    s.add(ticket("r1", prompt_len=20))
    plan = s.schedule()
    s.complete(plan, {"r1": FAKE_TOKEN})
    s.finish("r1", FinishReason.STOP, keep_pages=True)
    assert "r1" in s.kept
    s.check_integrity()
    assert s.release_reserved("r1") and "r1" not in s.kept
