"""The real protocol: no violation and liveness over the whole small world,
and the searches cover every handler of the running system."""
from bulkhead.protocol import transitions
from bulkhead.verify.actors.config import Guards, Variant
from bulkhead.verify.checker import explore
from bulkhead.verify.coverage import handler_coverage
from bulkhead.verify.world import drain_world, small_world
from tests.disagg.test_lifecycle import EVERY_ROW


def test_real_protocol_has_no_violation_and_always_terminates():
    world = small_world()
    transitions.calls.clear()
    result = explore(world, world.protocol(Guards(), Variant.REAL), liveness=True)
    assert result.complete and result.liveness_checked
    assert result.violations == {}, result.violations
    assert result.stuck_states == 0, result.stuck_example
    assert result.states > 10_000  # the search really ran (no vacuous pass)
    # The small world has faults (a corrupted write, a duplicate); the
    # every-row world has waits for rooms and pages and a rejection.
    explored = transitions.explored()
    transitions.calls.clear()
    assert explore(EVERY_ROW, EVERY_ROW.protocol(Guards(), Variant.REAL), liveness=False).ok
    drain = drain_world()  # the operator drains a worker: requests to it are held
    assert explore(drain, drain.protocol(Guards(), Variant.REAL), liveness=False).ok
    coverage = handler_coverage(explored | transitions.explored())
    not_covered = {f"{c.handler.actor} {c.handler.on}": c.missing for c in coverage if c.missing}
    assert not_covered == {}
    assert sum(1 for c in coverage if c.status == "covered") >= 8  # not vacuous: most handlers change state


def test_the_last_token_waits_for_a_duplicated_dma_to_land(monkeypatch):
    """The success path frees pages at the last token with no drain wait;
    the model's fence is that no admitted DMA is still landing then. Take
    the fence away and the search finds a duplicated write landing on the
    freed page (the fault it needs is in the small world)."""
    from dataclasses import replace

    from bulkhead.verify import model

    world = replace(small_world(), fault_kinds=frozenset({"duplicate"}))
    assert explore(world, world.protocol(), liveness=False).ok
    monkeypatch.setattr(model, "dmas_in_flight", lambda state: set())
    result = explore(world, world.protocol(), liveness=False,
                     goal=lambda kind, detail, labels: kind == "write_on_moved_page", stop_at_goal=True)
    labels = result.violations["write_on_moved_page"].labels
    assert any("last token" in label for label in labels)
    assert not any("lease" in label or "aborts" in label for label in labels)
