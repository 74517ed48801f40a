"""What reaches the protocol that is not a message between its actors:
events from the runtime (client, timers, scheduler, operator), the notes a
step function emits for observers (the model checker; the runtime's safe
mode and logs), and a step's result.

The runtime has each event too, under its own name: a request's coroutine
(Submit, ClientAbort, DeadlinePassed), the operator's drain (DrainWorker),
the registry noticing a restart (PeerLost), prefill's transfer thread
ending (Quiesced), decode's tick (LeaseExpired) and engine output (DecodeStep).
"""
from __future__ import annotations

from dataclasses import dataclass

from bulkhead.protocol.types import Outcome
from bulkhead.verify.actors.config import RequestSpec


@dataclass(frozen=True)
class _ForRequest:
    """An event about one request (each subclass is its own event: dataclass
    equality compares the class)."""
    rid: int


@dataclass(frozen=True)
class Submit:
    spec: RequestSpec


@dataclass(frozen=True)
class DrainWorker:
    """The operator drains a worker (or it is leaving): the router assigns
    it nothing more; what it holds finishes through the protocol as ever."""
    worker: tuple


class ClientAbort(_ForRequest):
    """The client went away."""


class DeadlinePassed(_ForRequest):
    """The runtime's timer says the request's deadline passed: logical time
    enters the protocol only through events like this one."""


@dataclass(frozen=True)
class PeerLost:
    """Heartbeats say a worker restarted; it now runs `incarnation`."""
    worker: tuple
    incarnation: int


class Reserved(_ForRequest):
    """Decode's engine has reserved rid's pages (a command of its own, on
    the engine thread): the reservation's outcome reaches the job."""


class HandedOver(_ForRequest):
    """Prefill's engine has computed rid's prompt and hands its KV over
    (after the outcome too: the engine is not stopped mid-step)."""


class PromptFailed(_ForRequest):
    """Prefill's engine ends rid's prompt with an error before the hand-over."""


class Quiesced(_ForRequest):
    """Prefill's completion queue holds no outstanding write for rid."""


class WriteFailed(_ForRequest):
    """Prefill's transfer failed while a write of it may still be in flight
    (the runtime's TransferError(drained=False), a timeout): it reports the
    failure and never acks."""


class LeaseExpired(_ForRequest):
    """Decode's drain lease for rid ran out (the fence: the writer's own
    lease ran out earlier and in-flight DMA outlives neither)."""


@dataclass(frozen=True)
class DecodeStep:
    """Decode's scheduler runs the request's decode step; `last`: the one
    that produces its last token (the success path's end)."""
    rid: int
    last: bool = False


# --- notes: what observers may check --------------------------------------

@dataclass(frozen=True)
class PageRead:
    """Attention read a page on behalf of rid."""
    rid: int
    tenant: str
    epoch: int
    page: int
    content: object


@dataclass(frozen=True)
class WriteLanded:
    """A DMA landed. owner/gen are the ledger's at landing time; the write's
    own are rid/write_gen."""
    decode: int
    page: int
    rid: int
    write_gen: int
    owner: int | None
    gen: int


@dataclass(frozen=True)
class Committed:
    """Decode marked rid's KV ready."""
    decode: int
    rid: int
    epoch: int
    pages: tuple[int, ...]


@dataclass(frozen=True)
class ClientResponse:
    """The one response the client sees."""
    rid: int
    outcome: Outcome
    detail: str = ""


@dataclass(frozen=True)
class Step:
    """Result of one transition: the new state, messages to send (each in
    an Envelope), notes."""
    state: object
    send: tuple = ()
    notes: tuple = ()
