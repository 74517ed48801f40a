"""One set of messages and one ticket (issue 13): the runtime's wire and the
model checker's network carry the same classes, and nothing outside
bulkhead/protocol/messages.py defines a message kind of its own."""
import ast
from dataclasses import replace
from pathlib import Path

from bulkhead.disagg import messages as wire
from bulkhead.disagg.ticket import sign, verify
from bulkhead.protocol import messages as protocol_messages
from bulkhead.protocol.ticket import SignedTicket, Ticket
from bulkhead.verify.actors import network
from bulkhead.verify.checker import explore
from bulkhead.verify.model import in_flight
from bulkhead.verify.world import drain_world, small_world
from tests.disagg.tickets import make_ticket

PACKAGE = Path(__file__).resolve().parents[2] / "bulkhead"


def test_the_wire_codec_speaks_the_protocols_own_classes():
    for cls in protocol_messages.MESSAGES:
        assert getattr(wire, cls.__name__) is cls
        assert wire.BY_KIND[cls.kind] is cls


def test_no_message_kind_is_defined_anywhere_else():
    """A class with a `kind = "..."` attribute is a message; only one module has them."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(s, ast.Assign) and any(getattr(t, "id", "") == "kind" for t in s.targets)
                    and isinstance(s.value, ast.Constant) for s in node.body):
                found.append(str(path.relative_to(PACKAGE)))
    assert set(found) == {"protocol/messages.py"}


def test_the_runtimes_verified_ticket_is_the_protocols_ticket():
    key = b"k" * 32
    signed = sign(make_ticket(), key)
    assert type(signed) is SignedTicket and type(verify(signed, key, 100)) is Ticket


def test_the_checkers_network_carries_only_protocol_messages():
    """Every message the model's actors put in flight, in a search of
    the drain world (all of it) and of one request with a client abort (a
    success sends no Finalize), is one of the protocol's types (in an Envelope)."""
    seen = set()
    drain = drain_world()
    aborted = replace(small_world(), requests=drain.requests[:1], fault_kinds=frozenset({"abort"}))

    import bulkhead.verify.checker as checker
    original = checker.successors

    def recording(world, config, state):
        out = original(world, config, state)
        for transition in out:
            seen.update(type(e.body) for e in in_flight(transition.state))
        return out

    checker.successors = recording
    try:
        for world in (drain, aborted):
            explore(world, world.protocol(), liveness=False)
    finally:
        checker.successors = original
    allowed = set(protocol_messages.MESSAGES) | set(network.DATA_MESSAGES)
    assert seen and seen <= allowed
    assert {wire.Assign, wire.PagesGranted, wire.TransferDone, wire.Finalize, wire.DrainAck, wire.Output} <= seen
