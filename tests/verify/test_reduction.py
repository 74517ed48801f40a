"""The checker drops control messages addressed to a DONE record. That is
sound only if every step function ignores them: check it."""
from bulkhead.protocol.manifest import Manifest
from bulkhead.protocol.messages import Assign, DrainAck, Endpoint, Finalize, PagesGranted, TransferDone
from bulkhead.protocol.ticket import SignedTicket, Ticket
from bulkhead.protocol.types import Outcome
from bulkhead.verify.actors.config import ProtocolConfig, RequestSpec
from bulkhead.verify.actors.decode import decode_initial, decode_step
from bulkhead.verify.actors.network import Envelope
from bulkhead.verify.actors.prefill import PrefillState, prefill_step
from bulkhead.verify.actors.values import MODEL_MAC, decode_addr, prefill_addr

CONFIG = ProtocolConfig((4,), (4,), 8, 1)
TICKET = SignedTicket(Ticket(RequestSpec(0, "A", 1, 1, 0, 0), 0, 1), MODEL_MAC)


def test_decode_ignores_control_messages_for_done_requests():
    state = decode_step(CONFIG, decode_initial(CONFIG, 0), Envelope(decode_addr(0), Finalize(0, Outcome.ABORTED))).state
    manifest = Manifest(0, "A", 0, 1, 0, 1, (3,), (), (0,))
    for message in (Assign(0, TICKET), Finalize(0, Outcome.FINISHED), DrainAck(0),
                    TransferDone(0, manifest, 0, (), None)):
        step = decode_step(CONFIG, state, Envelope(decode_addr(0), message))
        assert step.state == state and step.send == () and step.notes == ()


def test_prefill_ignores_control_messages_for_done_requests():
    from bulkhead.verify.actors.events import Quiesced
    state = prefill_step(CONFIG, PrefillState(0), Envelope(prefill_addr(0), Finalize(0, Outcome.ABORTED))).state
    state = prefill_step(CONFIG, state, Quiesced(0)).state
    grant = PagesGranted(0, 0, 1, (), (), Endpoint("model", (0, 1)), float("inf"))
    for message in (Assign(0, TICKET), Finalize(0, Outcome.FINISHED), grant):
        step = prefill_step(CONFIG, state, Envelope(prefill_addr(0), message))
        assert step.state == state and step.send == ()
