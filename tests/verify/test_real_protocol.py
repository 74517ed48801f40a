"""The real protocol: no violation and liveness over the whole small world."""
from bulkhead.protocol import Guards, Variant
from bulkhead.verify.checker import explore
from bulkhead.verify.world import small_world


def test_real_protocol_has_no_violation_and_always_terminates():
    world = small_world()
    result = explore(world, world.protocol(Guards(), Variant.REAL), liveness=True)
    assert result.complete and result.liveness_checked
    assert result.violations == {}, result.violations
    assert result.stuck_states == 0, result.stuck_example
    assert result.states > 10_000  # the search really ran (no vacuous pass)
