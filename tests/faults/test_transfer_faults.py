"""The KV transfer itself goes wrong: bytes or claims that do not match what
decode granted, a slow writer, a writer that starts after its write window,
a write stalled past the request's deadline."""

import uuid

import pytest

from tests.disagg.cluster_tools import arm, disarm, total, wait_for
from tests.faults.checks import LONG_PROMPT, assert_recovered, expect_error, greedy


@pytest.mark.parametrize("fault", ["corrupt_page", "wrong_pages", "short_transfer", "stale_generation"])
def test_bad_kv_is_refused_by_decode(cluster, fault):
    fired, refused = total(cluster, f"fault_{fault}", fresh=True), total(cluster, "coverage_failures", "decode")
    arm(cluster, fault)
    expect_error(500, "kv_transfer_failed", greedy, cluster, LONG_PROMPT)  # (a) nothing decoded on it
    disarm(cluster)
    wait_for(lambda: total(cluster, f"fault_{fault}") > fired, what="fault fired")  # (d)
    wait_for(lambda: total(cluster, "coverage_failures", "decode") > refused, what="decode refused the KV")
    assert_recovered(cluster)


def test_slow_transfer_gives_the_fault_free_answer(cluster):
    reference = greedy(cluster, LONG_PROMPT, salt=uuid.uuid4().hex)
    fired = total(cluster, "fault_slow_transfer", fresh=True)
    arm(cluster, "slow_transfer")
    assert greedy(cluster, LONG_PROMPT, salt=uuid.uuid4().hex) == reference  # (a) correct, only later
    disarm(cluster)
    wait_for(lambda: total(cluster, "fault_slow_transfer") > fired, what="fault fired")
    assert_recovered(cluster)


def test_writer_that_misses_its_write_window_writes_nothing(cluster):
    # write_within_s after the grant, decode may already count on the pages
    # being untouched (its lease starts from the grant): a late writer backs off.
    fired, skipped = total(cluster, "fault_stall_past_grant", fresh=True), total(cluster, "transfers_skipped", "prefill")
    arm(cluster, "stall_past_grant")
    expect_error(500, "kv_transfer_failed", greedy, cluster, LONG_PROMPT)
    disarm(cluster)
    wait_for(lambda: total(cluster, "fault_stall_past_grant") > fired, what="fault fired")
    wait_for(lambda: total(cluster, "transfers_skipped", "prefill") > skipped, what="the write was skipped")
    assert_recovered(cluster)


def test_transfer_stalled_past_the_request_deadline(cluster):
    # The stalled write lands only after the router's 504 finalized the
    # request; decode keeps the pages fenced until prefill's drain ack.
    fired = total(cluster, "fault_stall_transfer", fresh=True)
    arm(cluster, "stall_transfer")
    expect_error(504, "request_timed_out", greedy, cluster, LONG_PROMPT)
    disarm(cluster)
    wait_for(lambda: total(cluster, "fault_stall_transfer") > fired, what="fault fired")
    assert_recovered(cluster)
