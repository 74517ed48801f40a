"""Drain in the protocol model: the operator may drain any worker at any
moment; the router assigns it nothing more, and what it holds still ends
through the drain ack or the lease (every page property, and liveness)."""
from bulkhead.protocol import router_job
from bulkhead.protocol.transitions import JobStep
from bulkhead.verify.actors.config import Guards, Variant
from bulkhead.verify.checker import explore
from bulkhead.verify.world import drain_world


def test_a_drained_worker_is_assigned_nothing_and_every_request_still_ends():
    world = drain_world()
    result = explore(world, world.protocol(Guards(), Variant.REAL), liveness=True)
    assert result.complete and result.ok, (result.violations, result.stuck_example)
    assert result.states > 5_000  # the drains really happened (the world without them is smaller)


def test_without_the_drain_check_the_checker_finds_an_assign_to_a_draining_worker(monkeypatch):
    real = router_job.bootstrap

    def ignores_drain(phase, pair_draining=False, **kwargs) -> JobStep:
        return real(phase, False, **kwargs)

    monkeypatch.setattr(router_job, "bootstrap", ignores_drain)
    world = drain_world()
    result = explore(world, world.protocol(Guards(), Variant.REAL), liveness=False)
    found = result.found(lambda kind, detail, labels: kind == "assigned_to_draining")
    assert found is not None
    assert any(label.startswith("operator drains") for label in found.labels)
