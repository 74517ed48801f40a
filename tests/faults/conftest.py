import pytest

from tests.disagg.cluster_tools import disarm
from tests.faults.fault_cluster import start_fault_cluster
from tests.faults.checks import greedy


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/faults/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)  # real processes, the real model


@pytest.fixture(scope="session")
def cluster(tmp_path_factory, smollm2_dir):
    """One router + 2 prefill + 2 decode processes shared by every scenario;
    scenarios that kill a process start its replacement before they end."""
    c = start_fault_cluster(tmp_path_factory.mktemp("fault-cluster"))
    try:
        c.reference = greedy(c)  # the fault-free answer every recovery check compares with
        yield c
    finally:
        c.stop()


@pytest.fixture(autouse=True)
def _disarmed(request):
    """No fault outlives its scenario, whatever the scenario's outcome."""
    yield
    if "cluster" in request.fixturenames:
        disarm(request.getfixturevalue("cluster"))
