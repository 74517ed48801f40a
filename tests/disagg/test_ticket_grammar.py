"""The grammar crosses prefill -> decode inside the signed ticket: it
round-trips exactly, and a changed grammar breaks the signature (a forged
constraint cannot reach a worker)."""
import dataclasses

import pytest

from bulkhead.disagg.ticket import TicketError, sign, signed_ticket_from_dict, signed_ticket_to_dict, verify
from bulkhead.model import guidance
from tests.disagg.tickets import make_ticket

KEY = b"k" * 32


def test_the_grammar_round_trips_in_the_signed_ticket():
    grammar = guidance.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    signed = sign(make_ticket(grammar=grammar), KEY)
    back = signed_ticket_from_dict(signed_ticket_to_dict(signed))
    assert back.ticket.admitted.params.grammar == grammar
    verify(back, KEY, context_length=100)


def test_a_changed_grammar_breaks_the_signature():
    signed = sign(make_ticket(grammar=guidance.regex("[0-9]+")), KEY)
    admitted = signed.ticket.admitted
    params = dataclasses.replace(admitted.params, grammar=guidance.regex(".*"))
    forged_ticket = dataclasses.replace(signed.ticket, admitted=dataclasses.replace(admitted, params=params))
    with pytest.raises(TicketError):
        verify(dataclasses.replace(signed, ticket=forged_ticket), KEY, context_length=100)
