"""The router's worker registry and pairing gate, without a link or a model."""
import pytest

from bulkhead.disagg.registry import PAIR_KEYS, WorkerRegistry
from bulkhead.errors import Overloaded


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def info(name: str, role: str, **overrides) -> dict:
    return {"name": name, "role": role, "model": "m", "kv_layout": {"num_layers": 2}, "page_size": 16,
            "kv_dtype": "float32", "vocab_size": 100, "context_length": 4096, "pool_tokens": 8192} | overrides


def registry_with_pair(clock=None) -> WorkerRegistry:
    registry = WorkerRegistry("m", clock or Clock(), lost_after_s=3.0)
    assert registry.register("p0", info("p0", "prefill"), None, "p0#1") == (None, False)
    assert registry.register("d0", info("d0", "decode", context_length=2048, pool_tokens=1024), None, "d0#1") == (
        None, False)
    return registry


def test_limits_are_the_smallest_over_live_workers():
    limits = registry_with_pair().limits()
    assert (limits.context_length, limits.pool_tokens, limits.page_size) == (2048, 1024, 16)


def test_no_pair_no_limits_and_no_pairing():
    registry = WorkerRegistry("m", Clock())
    registry.register("p0", info("p0", "prefill"), None, "p0#1")
    with pytest.raises(Overloaded):
        registry.limits()
    with pytest.raises(Overloaded, match="1 prefill, 0 decode"):
        registry.pick_pair(lambda w: 0)


@pytest.mark.parametrize("key", PAIR_KEYS[1:])
def test_the_gate_refuses_a_worker_whose_kv_would_mean_something_else(key):
    registry = registry_with_pair()
    reason, _ = registry.register("d1", info("d1", "decode", **{key: "other"}), None, "d1#1")
    assert reason is not None and reason.startswith(key) and registry.refused == {"d1": reason}
    assert "d1" not in registry.workers


def test_the_gate_refuses_another_model_and_a_non_worker_role():
    registry = registry_with_pair()
    assert "differs from the router's" in registry.register("x", info("x", "decode", model="n"), None, "x")[0]
    assert "not a worker role" in registry.register("y", info("y", "router"), None, "y")[0]


def test_a_new_incarnation_replaces_the_old_and_says_so():
    registry = registry_with_pair()
    assert registry.register("d0", info("d0", "decode"), None, "d0#1") == (None, False)  # a repeat
    assert registry.register("d0", info("d0", "decode"), None, "d0#2") == (None, True)  # a restart
    assert registry.workers["d0"].incarnation == "d0#2"


def test_a_silent_worker_is_lost_then_forgotten_and_may_come_back():
    clock = Clock()
    registry = registry_with_pair(clock)
    clock.now = 2.0
    registry.heard_from("p0")
    clock.now = 4.0
    assert [(w.name, silent_s) for w, silent_s in registry.sweep()] == [("d0", 4.0)]
    assert [w.name for w in registry.live()] == ["p0"]
    assert registry.sweep() == []  # declared once
    with pytest.raises(Overloaded):
        registry.limits()
    registry.forget("d0")
    assert registry.heard_from("d0") is None
    assert registry.register("d0", info("d0", "decode"), None, "d0#2") == (None, False)
    assert "d0" in [w.name for w in registry.live()]


def test_pick_pair_takes_the_least_loaded_of_each_role():
    registry = registry_with_pair()
    registry.register("p1", info("p1", "prefill"), None, "p1#1")
    load = {"p0": 3, "p1": 1, "d0": 0}
    prefill, decode = registry.pick_pair(lambda w: load[w.name])
    assert (prefill.name, decode.name) == ("p1", "d0")


def test_heartbeats_refresh_what_the_router_reports():
    registry = registry_with_pair()
    worker = registry.heard_from("p0")
    registry.heartbeat(worker, info("p0", "prefill", free_pages=7), {"assigned": 2}, {"accepted": 5})
    [described] = [d for d in registry.describe() if d["name"] == "p0"]
    assert described["free_pages"] == 7 and described["counters"] == {"assigned": 2}
    assert described["heartbeats"] == 1 and described["lost"] is False
