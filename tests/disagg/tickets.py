"""A small builder for admission tickets in unit tests."""

from bulkhead.protocol.ticket import Ticket
from bulkhead.engine.admission import Admitted
from bulkhead.engine.request import SamplingParams


def make_ticket(request_id="r1", tenant="alpha", room=1, epoch=1, prompt_token_ids=(1, 2, 3), max_tokens=4,
                context_length=100, cache_salt=None, **params) -> Ticket:
    """Unsigned; sign it with bulkhead.disagg.ticket.sign(ticket, key)."""
    admitted = Admitted(request_id, tenant, tuple(prompt_token_ids), SamplingParams(max_tokens=max_tokens, **params),
                        context_length, cache_salt)
    return Ticket(admitted, room, epoch)
