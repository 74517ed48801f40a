"""The control plane drops every message that lacks a valid HMAC: unsigned,
signed under another key, truncated. test_control.py covers forged bodies,
replays and non-JSON; these are the remaining ways a frame can arrive bad."""

import pytest

from bulkhead.disagg.signing import Signer

KEY = b"k" * 32


def genuine():
    return Signer(KEY, "prefill-0").seal({"kind": "drain_ack", "request_id": "r1"})


@pytest.mark.parametrize("frames,counter", [
    (lambda body, mac: [body, b""], "dropped_bad_mac"),  # unsigned: an empty MAC frame
    (lambda body, mac: [body], "dropped_malformed"),  # unsigned: no MAC frame at all
    (lambda body, mac: [body, Signer(b"w" * 32, "x").mac(body)], "dropped_bad_mac"),  # signed under a wrong key
    (lambda body, mac: [body, mac[:32]], "dropped_bad_mac"),  # MAC truncated
    (lambda body, mac: [body[:-1], mac], "dropped_bad_mac"),  # body truncated
    (lambda body, mac: [body, mac, b"extra"], "dropped_malformed"),  # a frame too many
    (lambda body, mac: [b"", b""], "dropped_bad_mac"),  # empty
], ids=["empty-mac", "no-mac", "wrong-key", "truncated-mac", "truncated-body", "extra-frame", "empty"])
def test_a_message_without_a_valid_hmac_is_dropped_and_counted(frames, counter):
    router = Signer(KEY, "router")
    body, mac = genuine()
    assert router.open(frames(body, mac)) is None
    assert getattr(router.stats, counter) == 1 and router.stats.accepted == 0
    # Dropping it consumed nothing: the genuine message still opens afterwards.
    assert router.open([body, mac])["request_id"] == "r1"
