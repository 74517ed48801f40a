"""Control messages duplicated, lost or reordered between the workers and
the router. Nothing retransmits: a duplicate or an overtaken (older-seq)
message is dropped and counted by the receiver, and a request whose message
is lost ends at the router's deadline with a typed 504, its pages freed."""

import pytest

from tests.disagg.cluster_tools import arm, disarm, total, wait_for
from tests.faults.checks import LONG_PROMPT, PROMPT, assert_recovered, expect_error, greedy


def _dropped_replays(cluster) -> int:
    return cluster.info()["control_plane"]["dropped_replay"]


def test_duplicated_control_message_is_dropped(cluster):
    dropped, fired = _dropped_replays(cluster), total(cluster, "fault_replay_control")
    arm(cluster, "replay_control")
    assert greedy(cluster, PROMPT) == cluster.reference  # (a) the answer, as if sent once
    disarm(cluster)
    wait_for(lambda: total(cluster, "fault_replay_control") > fired, what="fault fired")  # (d)
    assert _dropped_replays(cluster) > dropped
    assert_recovered(cluster)


@pytest.mark.parametrize("kind", ["prefill_ready", "pages_granted", "transfer_done"])
def test_lost_control_message_ends_at_the_deadline(cluster, kind):
    fired = total(cluster, f"fault_lose_{kind}", fresh=True)
    arm(cluster, f"lose_{kind}")
    expect_error(504, "request_timed_out", greedy, cluster, LONG_PROMPT)
    disarm(cluster)
    wait_for(lambda: total(cluster, f"fault_lose_{kind}") > fired, what="fault fired")
    assert_recovered(cluster)


def test_lost_drain_ack_pages_wait_for_the_lease(cluster):
    expiries = total(cluster, "lease_expiries", "decode", fresh=True)
    fired = total(cluster, "fault_lose_drain_ack")
    arm(cluster, "corrupt_page", "lose_drain_ack")
    expect_error(500, "kv_transfer_failed", greedy, cluster, LONG_PROMPT)
    # Armed until the lease ends: prefill acks again on the router's finalize.
    wait_for(lambda: total(cluster, "lease_expiries", "decode") > expiries, what="the lease expired")
    disarm(cluster)
    assert total(cluster, "fault_lose_drain_ack") > fired
    assert_recovered(cluster)


def test_reordered_control_message_is_dropped(cluster):
    # transfer_done is overtaken by the drain_ack sent right after it: the
    # router drops the older sequence number, so the request never commits.
    dropped, fired = _dropped_replays(cluster), total(cluster, "fault_reorder_transfer_done")
    arm(cluster, "reorder_transfer_done")
    expect_error(504, "request_timed_out", greedy, cluster, LONG_PROMPT)
    disarm(cluster)
    wait_for(lambda: total(cluster, "fault_reorder_transfer_done") > fired, what="fault fired")
    assert _dropped_replays(cluster) > dropped
    assert_recovered(cluster)
