"""The fault matrix's link (tests/faults/harness.py: lose, reorder, replay at
the link's transmit seam) does what the matrix relies on, and the receiving
side drops what it must: checked on the link's flush with a recording
socket, no ZeroMQ, no processes."""

from bulkhead.disagg.signing import Signer
from tests.faults.harness import Faults, FaultyLink, Injector

KEY = b"k" * 32


class RecordingSocket:
    def __init__(self):
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames):
        self.sent.append(frames)


def _flush(tmp_path, armed: list[str], kinds: list[str]) -> tuple[list[str], Faults]:
    """Send messages of `kinds` through a worker link with `armed` faults; the kinds the router accepts."""
    faults_file = tmp_path / "faults"
    faults_file.write_text("\n".join(armed) + "\n")
    faults = Faults(str(faults_file))
    link, sock = FaultyLink(Injector(faults), Signer(KEY, "prefill-0"), "tcp://127.0.0.1:1"), RecordingSocket()
    for i, kind in enumerate(kinds):
        link.send({"kind": kind, "request_id": f"r{i}"})
    link._flush(sock)
    router = Signer(KEY, "router")
    accepted = [m["kind"] for m in (router.open(frames) for frames in sock.sent) if m is not None]
    return accepted, faults


def test_a_lost_message_never_leaves(tmp_path):
    accepted, faults = _flush(tmp_path, ["lose_transfer_done"], ["prefill_ready", "transfer_done", "drain_ack"])
    assert accepted == ["prefill_ready", "drain_ack"]
    assert faults.counters() == {"fault_lose_transfer_done": 1}


def test_a_reordered_message_is_overtaken_and_dropped_as_a_replay(tmp_path):
    accepted, faults = _flush(tmp_path, ["reorder_transfer_done"], ["transfer_done", "drain_ack"])
    assert accepted == ["drain_ack"]  # transfer_done arrived second, with the older sequence number
    assert faults.counters() == {"fault_reorder_transfer_done": 1}


def test_a_replayed_message_is_accepted_once(tmp_path):
    accepted, faults = _flush(tmp_path, ["replay_control"], ["prefill_ready"])
    assert accepted == ["prefill_ready"]
    assert faults.counters() == {"fault_replay_control": 1}


def test_unarmed_link_sends_everything_in_order(tmp_path):
    accepted, faults = _flush(tmp_path, [], ["prefill_ready", "transfer_done", "drain_ack"])
    assert accepted == ["prefill_ready", "transfer_done", "drain_ack"]
    assert faults.counters() == {}
