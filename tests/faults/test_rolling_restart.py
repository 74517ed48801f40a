"""A rolling restart under steady load (tests/faults/roll.py): no request
may fail, every worker leaves on its own once drained, and every page
comes back scrubbed."""
from tests.faults.checks import assert_recovered
from tests.faults.fault_cluster import WORKERS
from tests.faults.roll import all_live, roll


def test_a_rolling_restart_under_load_fails_no_request_and_leaks_no_page(cluster):
    result = roll(cluster)
    assert result.failed == [], result.failed[:3]
    assert result.exit_codes == {name: 0 for name in WORKERS}  # each left on its own, drained
    assert result.served >= 2 * len(WORKERS)
    assert all_live(cluster)
    assert_recovered(cluster)  # 0 owned, 0 dirty pages everywhere; still the fault-free answer
