"""The grammar crosses prefill -> decode inside the signed ticket: it
round-trips exactly, and a changed grammar breaks the signature (a forged
constraint cannot reach a worker)."""
import dataclasses

import pytest

from bulkhead.disagg.ticket import SignedTicket, TicketError
from bulkhead.model import guidance
from tests.disagg.tickets import make_ticket

KEY = b"k" * 32


def test_the_grammar_round_trips_in_the_signed_ticket():
    grammar = guidance.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    ticket = make_ticket(grammar=grammar).signed(KEY)
    back = SignedTicket.from_dict(ticket.to_dict())
    assert back.admitted.params.grammar == grammar
    back.verify(KEY, context_length=100)


def test_a_changed_grammar_breaks_the_signature():
    ticket = make_ticket(grammar=guidance.regex("[0-9]+")).signed(KEY)
    params = dataclasses.replace(ticket.admitted.params, grammar=guidance.regex(".*"))
    forged = dataclasses.replace(ticket, admitted=dataclasses.replace(ticket.admitted, params=params))
    with pytest.raises(TicketError):
        forged.verify(KEY, context_length=100)
