"""The checker drops control messages addressed to a DONE record. That is
sound only if every step function ignores them: check it."""
from bulkhead.protocol import (
    Assign, DrainAck, Finalize, Outcome, PagesGranted, Ticket, TransferDone, decode_addr,
    decode_initial, decode_step, prefill_addr, prefill_step, PrefillState, ProtocolConfig, Manifest,
)

CONFIG = ProtocolConfig((4,), (4,), 8, 1)
TICKET = Ticket(0, "A", 1, 1, 0, 1, 0, 0)


def test_decode_ignores_control_messages_for_done_requests():
    state = decode_step(CONFIG, decode_initial(CONFIG, 0), Finalize(decode_addr(0), 0, Outcome.ABORTED, 0)).state
    manifest = Manifest(0, "A", 0, 1, 0, 1, (3,), (), (0,))
    for message in (Assign(decode_addr(0), TICKET), Finalize(decode_addr(0), 0, Outcome.FINISHED, 0),
                    DrainAck(decode_addr(0), 0, 1), TransferDone(decode_addr(0), manifest)):
        step = decode_step(CONFIG, state, message)
        assert step.state == state and step.send == () and step.notes == ()


def test_prefill_ignores_control_messages_for_done_requests():
    from bulkhead.protocol import Quiesced
    state = prefill_step(CONFIG, PrefillState(0), Finalize(prefill_addr(0), 0, Outcome.ABORTED, 0)).state
    state = prefill_step(CONFIG, state, Quiesced(0)).state
    for message in (Assign(prefill_addr(0), TICKET), Finalize(prefill_addr(0), 0, Outcome.FINISHED, 0),
                    PagesGranted(prefill_addr(0), 0, 0, 1, 0, 1, ())):
        step = prefill_step(CONFIG, state, message)
        assert step.state == state and step.send == ()
