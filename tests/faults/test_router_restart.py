"""The router dies (kill -9) while a request is decoding, or while its KV is
in flight, and a new router starts on the same control address. The client's
connection drops without a finished answer; the workers, told by the new
router that it does not know them, abandon their orphaned requests (decode
frees a grant whose writer may still write only after the drain or lease)
and register again; the deployment serves."""

import pytest

from tests.disagg.cluster_tools import arm, disarm, total, wait_for
from tests.faults.checks import LONG_PROMPT, assert_recovered, open_request, read_some

STATES = {
    # state: (request, what the client has seen once the request is there, the fault that holds it there)
    # 470 tokens (decode's pool holds 512): the request must still be decoding
    # when the new router starts, and since decode steps run in one C call
    # 200 tokens could end first (~8 ms a token on one thread).
    "while_decoding": ({"prompt": "Write a very long essay about rivers.", "max_tokens": 470, "stream": True,
                        "ignore_eos": True}, b'"text"', None),
    "during_transfer": ({"prompt": LONG_PROMPT, "max_tokens": 8, "stream": True}, None, "stall_transfer"),
}


@pytest.mark.parametrize("state", list(STATES))
def test_router_kill_9_and_restart(cluster, state):
    body, marker, fault = STATES[state]
    abandoned = total(cluster, "jobs_abandoned", fresh=True)
    fired = total(cluster, f"fault_{fault}") if fault else 0
    if fault:
        arm(cluster, fault)
    sock = open_request(cluster, {**body, "temperature": 0})
    try:
        if marker:
            seen = read_some(sock, marker)
        else:
            wait_for(lambda: total(cluster, f"fault_{fault}") > fired, what=f"{fault} fired")
            seen = b""
        disarm(cluster)
        cluster.kill_router()
        seen += read_some(sock, b"never arrives")  # until the connection drops
    finally:
        sock.close()
    assert b"[DONE]" not in seen and b'"finish_reason":"length"' not in seen, seen  # (a) no finished answer
    cluster.start_router()
    cluster.wait_registered(timeout=60)
    wait_for(lambda: total(cluster, "jobs_abandoned") > abandoned, what="a worker abandoned its orphan")  # (d)
    assert_recovered(cluster)
