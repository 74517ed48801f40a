"""A small builder for admission tickets in unit tests."""

from bulkhead.disagg.ticket import SignedTicket
from bulkhead.engine.admission import Admitted
from bulkhead.engine.request import SamplingParams


def make_ticket(request_id="r1", tenant="alpha", room=1, epoch=1, prompt_token_ids=(1, 2, 3), max_tokens=4,
                context_length=100, cache_salt=None, **params) -> SignedTicket:
    """Unsigned; call .signed(key)."""
    admitted = Admitted(request_id, tenant, tuple(prompt_token_ids), SamplingParams(max_tokens=max_tokens, **params),
                        context_length, cache_salt)
    return SignedTicket(admitted, room, epoch)
