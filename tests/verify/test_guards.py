"""Every guard earns its keep: switch one off and the checker finds a
counterexample in the same environment the real protocol survives."""
import pytest

from bulkhead.verify.actors.config import Guards
from bulkhead.verify.scenarios import ablation_search

EXPECTED = {
    "admission_before_bootstrap": {"rejected_not_clean"},
    "coverage_check": {"commit_not_exact"},
    "digest_check": {"commit_not_exact", "foreign_read"},
    "drain_before_reuse": {"write_on_moved_page"},
    "generation_check": {"write_on_moved_page"},
    "scrub_on_free": {"free_page_dirty"},
    "hmac": {"rejected_not_clean", "write_on_moved_page"},
}


def test_every_guard_is_covered():
    assert set(EXPECTED) == set(Guards.names())


@pytest.mark.parametrize("guard", Guards.names())
def test_disabling_the_guard_yields_a_counterexample(guard):
    found = ablation_search(guard).found()
    assert found is not None, f"no counterexample without {guard}"
    assert found.kind in EXPECTED[guard], found
