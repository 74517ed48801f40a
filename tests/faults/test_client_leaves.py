"""A client that leaves (closes its connection) in each state of a request:
queued at prefill, during the KV transfer, while decode verifies it, while
decoding. The router aborts the request on both workers; every page it
held, on both sides, comes back scrubbed once no write can still land."""

import uuid

import pytest

from tests.disagg.cluster_tools import arm, disarm, total, wait_for
from tests.faults.checks import LONG_PROMPT, assert_recovered, open_request, read_some


def _aborts(cluster) -> int:
    return cluster.info()["counters"]["client_aborts"]


def _nothing_answered(sock) -> bytes:
    """What the client had received when it left: no token, no 200 body."""
    sock.setblocking(False)
    try:
        seen = sock.recv(65536)
    except BlockingIOError:
        seen = b""
    assert b'"text"' not in seen and b'"choices"' not in seen, seen
    return seen


# state -> the fault that holds the request in it (and fires when it is there)
HELD_BY = {"queued_at_prefill": "stall_prefill", "during_transfer": "stall_transfer",
           "while_decode_verifies": "stall_verify"}


@pytest.mark.parametrize("state,stream", [("queued_at_prefill", True), ("during_transfer", True),
                                          ("during_transfer", False), ("while_decode_verifies", True)],
                         ids=["queued_at_prefill", "during_transfer", "during_transfer-not_streaming",
                              "while_decode_verifies"])
def test_client_leaves(cluster, state, stream):
    fault = HELD_BY[state]
    fired, aborts = total(cluster, f"fault_{fault}", fresh=True), _aborts(cluster)
    arm(cluster, fault)
    sock = open_request(cluster, {"prompt": LONG_PROMPT, "max_tokens": 8, "temperature": 0, "stream": stream,
                                  "cache_salt": uuid.uuid4().hex})
    try:
        wait_for(lambda: total(cluster, f"fault_{fault}") > fired, what=f"{fault} fired")  # (d): it is there now
        disarm(cluster)
        _nothing_answered(sock)  # (a)
    finally:
        sock.close()
    wait_for(lambda: _aborts(cluster) > aborts, what="the router saw the client leave")
    assert_recovered(cluster)  # (b), (c)


def test_client_leaves_while_decoding(cluster):
    commits, aborts = total(cluster, "commits", "decode", fresh=True), _aborts(cluster)
    sock = open_request(cluster, {"prompt": "Write a very long essay about rivers.", "max_tokens": 470,
                                  "temperature": 0, "stream": True, "ignore_eos": True})
    try:
        first = read_some(sock, b'"text"')  # (a) tokens stream: the KV was verified and committed
        assert b" 200 OK" in first.split(b"\r\n", 1)[0]
        wait_for(lambda: total(cluster, "commits", "decode") > commits, what="decode committed")  # (d)
    finally:
        sock.close()
    wait_for(lambda: _aborts(cluster) > aborts, what="the router saw the client leave")
    assert_recovered(cluster)
