"""The control plane's typed messages: every kind survives the codec, and
anything that is not exactly a known kind is refused by the codec and
dropped and counted by the worker that hears it, never raised."""

import pytest

from bulkhead.disagg import messages as m
from bulkhead.disagg.signing import Signer
from bulkhead.disagg.decode_worker import DecodeWorker
from bulkhead.protocol.manifest import Manifest
from bulkhead.engine.outputs import RequestOutput
from bulkhead.engine.outputs import TokenLogprobs
from bulkhead.errors import Overloaded
from bulkhead.seams import Seams
from tests.disagg.test_decode_guard import FakeTarget
from tests.disagg.test_lifecycle import RecordingLink
from bulkhead.disagg.ticket import sign
from bulkhead.protocol.types import Outcome
from tests.disagg.tickets import make_ticket

TICKET = sign(make_ticket(room=3, cache_salt="salt", temperature=0.0, stop=("\n",), logit_bias=((5, -1.0),)), b"k" * 32)
MANIFEST = Manifest("r1", "alpha", 3, 1, 0, 3, (5, 6), (2, 2), (11, 12))
OUTPUT = RequestOutput("r1", (7, 8), "hi", (TokenLogprobs(7, -0.5, ((7, -0.5),)),), True, "error", 3, 2,
                       Overloaded("busy"))

EXAMPLES = [
    m.Register({"role": "decode"}, {"backend": "shm", "descriptor": {"path": "/x"}}), m.Register({"role": "prefill"}),
    m.Registered(), m.Refused("model differs"), m.Reregister(), m.Leaving(), m.Drain(), m.Resume(),
    m.Heartbeat({"free_pages": 3}, {"commits": 1}, {"sent": 2}),
    m.Assign("r1", TICKET), m.PrefillReady("r1"),
    m.PagesGranted("r1", 3, 1, (5, 6), (2, 2), m.Endpoint("shm", {"path": "/x"}), 1.0),
    m.TransferDone("r1", MANIFEST, 7, (TokenLogprobs(7, -0.5, ((7, -0.5), (9, -2.0))),), b"\x00gen-state"),
    m.TransferDone("r1", MANIFEST, 7, (), None), m.DrainAck("r1"),
    # echo's prompt logprobs, computed by prefill, ride to decode with the first token
    m.TransferDone("r1", MANIFEST, 7, (), None, (TokenLogprobs(4, -1.5, ((4, -1.5),)), TokenLogprobs(5, -0.2, ()))),
    m.Finalize("r1", Outcome.ABORTED), m.PrefillFailed("r1", "no", "internal_error"), m.TransferFailed("r1", "bad digest"),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda msg: type(msg).__name__)
def test_every_kind_round_trips(message):
    assert m.decode(m.encode(message)) == message


def test_every_kind_has_an_example():
    assert {type(x) for x in EXAMPLES} | {m.Output} == set(m.MESSAGES)


def test_an_output_round_trips_with_its_error():
    back = m.decode(m.encode(m.Output(OUTPUT))).output
    assert (back.request_id, back.token_ids, back.logprobs, back.finish_reason) == \
        (OUTPUT.request_id, OUTPUT.token_ids, OUTPUT.logprobs, OUTPUT.finish_reason)
    assert (back.error.status, back.error.code) == (503, OUTPUT.error.code)


def test_the_envelope_is_ignored():
    body = {**m.encode(m.DrainAck("r1")), "_from": "prefill-0", "_inc": "ab", "_seq": 4, "_ts": 1.0}
    assert m.decode(body) == m.DrainAck("r1")


@pytest.mark.parametrize("body,why", [
    ({"kind": "launch_missiles"}, "unknown kind"),
    ({"request_id": "r1"}, "unknown kind"),
    ([1, 2], "JSON object"),
    ({"kind": "drain_ack"}, "missing request_id"),
    ({"kind": "drain_ack", "request_id": 5}, "expected str"),
    ({"kind": "drain_ack", "request_id": "r1", "force": True}, "unknown fields"),
    ({"kind": "pages_granted", "request_id": "r1", "room": True, "epoch": 1, "pages": [], "generations": [],
      "transfer": {}, "write_within_s": 1}, "expected an integer"),
    ({"kind": "pages_granted", "request_id": "r1", "room": 1, "epoch": 1, "pages": ["5"], "generations": [],
      "transfer": {}, "write_within_s": 1}, "expected an integer"),
    ({"kind": "assign", "request_id": "r1", "ticket": {"request_id": "r1"}}, "signed_ticket_from_dict"),
    ({"kind": "transfer_done", "request_id": "r1", "manifest": "pages 1-3", "first_token": 1,
      "first_logprobs": [], "sampler_state": None}, "expected dict"),
    ({"kind": "transfer_done", "request_id": "r1", "manifest": m.encode(m.TransferDone("r1", MANIFEST, 1, (), None))
      ["manifest"], "first_token": 1, "first_logprobs": [], "sampler_state": "not base64!"}, "not base64"),
    ({"kind": "transfer_done", "request_id": "r1", "manifest": m.encode(m.TransferDone("r1", MANIFEST, 1, (), None))
      ["manifest"], "first_token": 1, "first_logprobs": [["x"]], "sampler_state": None}, "logprobs"),
])
def test_malformed_messages_are_refused(body, why):
    with pytest.raises(m.MalformedMessage, match=why):
        m.decode(body)


def test_a_worker_drops_and_counts_what_does_not_decode(make_engine):
    signer = Signer(b"k" * 32, "decode-0")
    worker = DecodeWorker(make_engine(), "tiny", signer, "tcp://127.0.0.1:1", target=FakeTarget(),
                          seams=Seams(make_link=RecordingLink))
    worker.on_message({"kind": "assign", "request_id": "r1", "ticket": "not a ticket"})
    worker.on_message({"kind": "heartbeat", "info": {}, "counters": {}, "control": {}})  # not a worker's to take
    assert signer.stats.dropped_malformed == 2
    assert worker.jobs == {} and worker.link.sent == []


class RecordingRouterLink:
    def __init__(self, *args, **kwargs):
        self.sent = []

    def send(self, worker, message):
        self.sent.append((worker, message))


def test_the_router_drops_and_counts_what_does_not_decode():
    from bulkhead.disagg.router import DisaggBackend

    signer = Signer(b"k" * 32, "router")
    router = DisaggBackend(None, "tiny", signer, "tcp://127.0.0.1:1", "api_keys", make_link=RecordingRouterLink)
    router._on_message("decode-0", {"kind": "output", "output": "not an output", "_inc": "a"})
    router._on_message("decode-0", {"kind": "register", "_inc": "a"})  # no info
    assert signer.stats.dropped_malformed == 2 and router.link.sent == []
    # A well-formed message from a worker the router does not know: register again.
    router._on_message("decode-0", {**m.encode(m.DrainAck("r1")), "_inc": "a"})
    assert router.link.sent == [("decode-0", m.encode(m.Reregister()))]


def test_an_output_carries_echos_prompt_logprobs_to_the_router():
    out = RequestOutput("r1", (7,), "x", (), False, None, 3, 1, prompt_logprobs=(TokenLogprobs(4, -1.5, ((4, -1.5),)),))
    assert m.decode(m.encode(m.Output(out))).output.prompt_logprobs == out.prompt_logprobs
