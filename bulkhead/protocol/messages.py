"""Messages between router, prefill and decode, events from the runtime
(client, timers, scheduler), and notes the step functions emit for
observers (the model checker; the runtime's safe mode and logs).

Every control message carries `signed`: in the runtime an HMAC over the
message under the cluster key, in the model a flag the environment clears
when it forges a message. The data plane (PageWrite, Landing) is not signed:
it is bound to operator-named addresses and fenced by generations instead.
"""
from __future__ import annotations

from dataclasses import dataclass

from bulkhead.protocol.manifest import Manifest
from bulkhead.protocol.types import Outcome, PageGrant, RequestSpec, Ticket

Addr = tuple  # ("router"|"prefill"|"decode", index)


# --- control plane: router -> workers --------------------------------------

@dataclass(frozen=True)
class Assign:
    """Bootstrap: the admitted request's ticket, sent to both workers."""
    dst: Addr
    ticket: Ticket
    signed: bool = True


@dataclass(frozen=True)
class Finalize:
    """The router's terminal decision. Workers record it, stop work and
    release resources (decode only after the prefill's drain ack)."""
    dst: Addr
    rid: int
    outcome: Outcome
    peer: int          # the other worker of the pair (prefill acks to it)
    epoch: int = 1
    signed: bool = True


# --- control plane: decode <-> prefill -------------------------------------

@dataclass(frozen=True)
class PagesGranted:
    """Decode's allocation for the request's prompt pages, with the ledger
    generation of each page and decode's incarnation."""
    dst: Addr
    rid: int
    room: int
    epoch: int
    decode: int
    incarnation: int
    grants: tuple[PageGrant, ...]
    signed: bool = True


@dataclass(frozen=True)
class TransferDone:
    """Prefill's claim: every page in the manifest was posted."""
    dst: Addr
    manifest: Manifest
    signed: bool = True


@dataclass(frozen=True)
class DrainAck:
    """Prefill: no write for this request is in flight and none will be
    posted again; decode may free the pages."""
    dst: Addr
    rid: int
    epoch: int
    signed: bool = True


# --- control plane: workers -> router --------------------------------------

@dataclass(frozen=True)
class DecodeDone:
    """Decode generated the tokens on committed KV (the 200)."""
    dst: Addr
    rid: int
    signed: bool = True


@dataclass(frozen=True)
class TransferFailed:
    """Decode could not verify the transfer; fail closed."""
    dst: Addr
    rid: int
    reason: str
    signed: bool = True


@dataclass(frozen=True)
class PrefillRejected:
    """LEGACY only: prefill's own 400 for a request over its limit, which the
    legacy router drops."""
    dst: Addr
    rid: int
    signed: bool = True


# --- data plane ------------------------------------------------------------

@dataclass(frozen=True)
class PageWrite:
    """A one-sided write posted by prefill for one decode page. Decode's
    transfer engine admits it against the ledger (generation check)."""
    dst: Addr
    rid: int
    room: int
    epoch: int
    incarnation: int
    page: int
    gen: int
    payload: object          # page content: kv_origin(rid, epoch) or GARBAGE
    signed: bool = True      # unused: the data plane is fenced, not signed


@dataclass(frozen=True)
class Landing:
    """An admitted write's DMA, in flight into decode's pool. It lands
    unconditionally (nothing can stop a DMA once admitted); that is why
    decode waits for the drain ack before freeing."""
    dst: Addr
    rid: int
    epoch: int
    incarnation: int
    page: int
    gen: int
    payload: object
    signed: bool = True


CONTROL_MESSAGES = (Assign, Finalize, PagesGranted, TransferDone, DrainAck,
                    DecodeDone, TransferFailed, PrefillRejected)
DATA_MESSAGES = (PageWrite, Landing)


# --- events from the runtime (client, timers, scheduler) ------------------

@dataclass(frozen=True)
class Submit:
    spec: RequestSpec


@dataclass(frozen=True)
class DrainWorker:
    """The operator drains a worker (or it is leaving): the router assigns
    it nothing more; what it holds finishes through the protocol as ever."""
    worker: Addr


@dataclass(frozen=True)
class ClientAbort:
    rid: int


@dataclass(frozen=True)
class DeadlinePassed:
    """The runtime's timer says the request's deadline passed: logical time
    enters the protocol only through events like this one."""
    rid: int


@dataclass(frozen=True)
class PeerLost:
    """Heartbeats say a worker restarted; it now runs `incarnation`."""
    worker: Addr
    incarnation: int


@dataclass(frozen=True)
class Quiesced:
    """Prefill's completion queue holds no outstanding write for rid."""
    rid: int


@dataclass(frozen=True)
class LeaseExpired:
    """Decode's drain lease for rid ran out (the fence: the writer's own
    lease ran out earlier and in-flight DMA outlives neither)."""
    rid: int


@dataclass(frozen=True)
class DecodeStep:
    """Decode's scheduler runs the request's decode step."""
    rid: int


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
    """Result of one transition: the new state, messages to send, notes."""
    state: object
    send: tuple = ()
    notes: tuple = ()
