import pytest

from bulkhead.kv.capacity import CapacityError, gate_context_length


def test_pool_that_holds_the_context_passes():
    d = gate_context_length(8192, 8192, clamp=False)
    assert (d.context_length, d.clamped) == (8192, False)


def test_pool_smaller_than_context_refuses_to_start_and_names_the_fix():
    # The incident's numbers.
    with pytest.raises(CapacityError) as e:
        gate_context_length(1_048_576, 681_280, clamp=False)
    msg = str(e.value)
    assert "681280" in msg and "1048576" in msg and "--kv-memory" in msg and "--clamp-context-length" in msg


def test_clamp_advertises_what_the_pool_holds(caplog):
    d = gate_context_length(1_048_576, 681_280, clamp=True)
    assert (d.context_length, d.clamped) == (681_280, True)
    assert "clamped" in caplog.text


def test_nonpositive_context_is_refused():
    with pytest.raises(CapacityError):
        gate_context_length(0, 10, clamp=True)
