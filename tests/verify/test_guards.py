"""Every guard earns its keep: switch one off and the checker finds a
counterexample in the same environment the real protocol survives."""
from dataclasses import fields

import pytest

from bulkhead.verify.actors.config import Guards, Variant
from bulkhead.verify.checker import Result, explore
from bulkhead.verify.world import default_world, small_world

GUARDS = [f.name for f in fields(Guards)]

EXPECTED = {
    "admission_before_bootstrap": {"rejected_not_clean"},
    "coverage_check": {"commit_not_exact"},
    "digest_check": {"commit_not_exact", "foreign_read"},
    "drain_before_reuse": {"write_on_moved_page"},
    "generation_check": {"write_on_moved_page"},
    "scrub_on_free": {"free_page_dirty"},
    "hmac": {"rejected_not_clean", "write_on_moved_page"},
}


def ablation_search(guard: str) -> Result:
    """The real protocol with one guard off: the shortest violation."""
    # Two guards need the over-long request: a late rejection, a forged ticket.
    world = default_world() if guard in ("admission_before_bootstrap", "hmac") else small_world()
    config = world.protocol(Guards().without(guard), Variant.REAL)
    return explore(world, config, goal=lambda kind, detail, labels: True, stop_at_goal=True, liveness=False)


def test_every_guard_is_covered():
    assert set(EXPECTED) == set(GUARDS)


@pytest.mark.parametrize("guard", GUARDS)
def test_disabling_the_guard_yields_a_counterexample(guard):
    found = ablation_search(guard).found()
    assert found is not None, f"no counterexample without {guard}"
    assert found.kind in EXPECTED[guard], found
