"""The model's network: its envelope, and the data plane as the model sees
one page of it (the runtime's transfer backends write a grant's pages in
one write_pages call). The control messages it carries are the runtime's
own (bulkhead.protocol.messages); these three types are the model's alone.

    PageWrite  prefill -> decode   a one-sided write of one page, to be admitted
    Landing    decode's pool       an admitted write's DMA, landing unconditionally
    Envelope   any -> any          a message in flight (below)
"""
from __future__ import annotations

from dataclasses import dataclass

from bulkhead.protocol.messages import RequestId
from bulkhead.verify.actors.events import Step

Addr = tuple  # the model's actor address: ("router"|"prefill"|"decode", index)


@dataclass(frozen=True)
class PageWrite:
    """One page of a one-sided write posted by prefill (the runtime's
    transfer backends write a grant's pages in one write_pages call).
    Decode's transfer engine admits it against the ledger (manifest.write_admissible)."""
    request_id: RequestId
    room: int
    epoch: int
    incarnation: int
    page: int
    gen: int
    payload: object          # page content: kv_origin(rid, epoch) or GARBAGE


@dataclass(frozen=True)
class Landing:
    """An admitted write's DMA, in flight into decode's pool. It lands
    unconditionally (nothing can stop a DMA once admitted); that is why
    decode waits for the drain ack before freeing."""
    request_id: RequestId
    epoch: int
    incarnation: int
    page: int
    gen: int
    payload: object


DATA_MESSAGES = (PageWrite, Landing)


@dataclass(frozen=True)
class Envelope:
    """A message in the model's network: where it goes, and whether it is
    authentic (the runtime's signer checks an HMAC; the model's environment
    forges by clearing `signed`). The data plane is fenced by generations,
    not signed."""
    dst: Addr
    body: object
    signed: bool = True


def dispatch(config, state, event, handlers: dict, actor: str) -> Step:
    """An actor's step: its handler for the event's type, given the message
    an Envelope carries. A forged one (unsigned: its HMAC does not verify)
    changes nothing while the hmac guard is on."""
    if isinstance(event, Envelope):
        if not event.signed and config.guards.hmac:
            return Step(state)
        event = event.body
    handler = handlers.get(type(event))
    if handler is None:
        raise TypeError(f"{actor} cannot handle {type(event).__name__}")
    return handler(config, state, event)
