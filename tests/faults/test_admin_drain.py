"""The operator API and `bulkhead admin` against a running deployment
(2 prefill + 2 decode): list, drain, resume; the drained worker gets no
new request while the others serve; typed refusals with exit codes."""
import subprocess
import sys
import time

from tests.disagg.cluster_tools import wait_for
from tests.faults.checks import greedy
from tests.faults.fault_cluster import WORKERS
from tests.server_process import OPERATOR_KEY

REFUSED = 1


def admin(cluster, *args, key=OPERATOR_KEY):
    return subprocess.run([sys.executable, "-m", "bulkhead.cli", "admin", args[0], cluster.url, *args[1:],
                           "--key", key], capture_output=True, text=True, timeout=60)


def states(cluster) -> dict:
    return {w["name"]: w["state"] for w in cluster.info()["workers"]}


def assigned(cluster, name) -> int:
    return next(w for w in cluster.info()["workers"] if w["name"] == name)["counters"].get("assigned", 0)


def test_drain_and_resume_a_worker_through_the_admin_command(cluster):
    listed = admin(cluster, "workers")
    assert listed.returncode == 0, listed.stderr
    assert all(name in listed.stdout for name in WORKERS) and "live" in listed.stdout
    drained = admin(cluster, "drain", "prefill-0")
    assert drained.returncode == 0, drained.stderr
    try:
        wait_for(lambda: states(cluster)["prefill-0"] == "drained", timeout=30, what="prefill-0 drained")
        time.sleep(1.1)  # two heartbeats: its counters are current
        before = assigned(cluster, "prefill-0")
        for _ in range(4):
            assert greedy(cluster) == cluster.reference  # served by prefill-1
        time.sleep(1.1)
        assert assigned(cluster, "prefill-0") == before  # nothing new went to the drained worker
    finally:
        resumed = admin(cluster, "resume", "prefill-0")
    assert resumed.returncode == 0, resumed.stderr
    wait_for(lambda: states(cluster)["prefill-0"] == "live", timeout=30, what="prefill-0 live again")


def test_draining_the_last_worker_of_a_role_is_refused_unless_forced(cluster):
    assert admin(cluster, "drain", "decode-0").returncode == 0
    try:
        last = admin(cluster, "drain", "decode-1")
        assert last.returncode == REFUSED
        assert "409 last_worker_of_role" in last.stderr and "force" in last.stderr
        assert states(cluster)["decode-1"] == "live"
        assert greedy(cluster) == cluster.reference
    finally:
        assert admin(cluster, "resume", "decode-0").returncode == 0
    wait_for(lambda: states(cluster)["decode-0"] == "live", timeout=30, what="decode-0 live again")


def test_bad_admin_requests_are_typed_errors_with_exit_codes(cluster):
    unknown = admin(cluster, "drain", "prefill-9")
    assert unknown.returncode == REFUSED and "404 worker_not_found" in unknown.stderr
    tenant = admin(cluster, "workers", key="sk-alpha-test")
    assert tenant.returncode == REFUSED and "403" in tenant.stderr
    assert states(cluster) == {name: "live" for name in WORKERS}
