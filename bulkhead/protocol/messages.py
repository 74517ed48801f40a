"""Every message of the protocol, as one frozen type each: the same classes
on the runtime's wire and in the model checker's network.

    message        from -> to                   means
    -------------  ---------------------------  ------------------------------------------------
    Register       worker -> router             my live limits (and decode's transfer endpoint)
    Registered     router -> worker             you passed the pairing gate
    Refused        router -> worker             you did not, and why
    Reregister     router -> worker             I do not know you: end your jobs, register again
    Heartbeat      worker -> router             live limits, page states and counters (and whether drained)
    Leaving        worker -> router             I am shutting down (SIGTERM): drain me
    Drain          router -> worker             no assignment follows this one: finish what you hold
    Resume         router -> worker             you may be assigned again
    Assign         router -> both workers       the signed admission ticket
    PrefillReady   prefill -> router -> decode  the prompt's KV exists: grant pages now
    PagesGranted   decode -> router -> prefill  pages and generations to write, and where
    TransferDone   prefill -> router -> decode  the manifest, the first token, sampler state
    DrainAck       prefill -> router -> decode  no write of mine can still land
    Finalize       router -> both workers       the request's one outcome
    Output         decode -> router             tokens (or the error) for the client; finished: the 200
    PrefillFailed  prefill -> router            the prompt could not be prefilled (LEGACY: its 400)
    TransferFailed worker -> router             the KV could not be moved or verified

Who a message goes to, and whether it is authentic, is not part of it:
the runtime's link seals each in the signer's envelope (disagg/signing.py)
and encodes it with the one codec (disagg/messages.py); the model checker's
network carries each in an `Envelope` (bulkhead.verify.actors.network),
worker to worker where the runtime's router relays. Which fields the model
leaves at a stand-in is said at each field.
"""
from __future__ import annotations

import typing
from dataclasses import dataclass

from bulkhead.protocol.manifest import Manifest
from bulkhead.protocol.outputs import RequestOutput, TokenLogprobs
from bulkhead.protocol.ticket import SignedTicket
from bulkhead.protocol.types import Outcome

# A request's id: a string on the wire; the model's are small ints.
RequestId = typing.Union[str, int]  # noqa: UP007


# --- registration and liveness (the registry's; the model has no registry) ----

@dataclass(frozen=True)
class Register:
    kind = "register"
    info: dict
    transfer: dict | None = None  # decode: {"backend", "descriptor"} its writers use


@dataclass(frozen=True)
class Registered:
    kind = "registered"


@dataclass(frozen=True)
class Refused:
    kind = "refused"
    reason: str


@dataclass(frozen=True)
class Reregister:
    kind = "reregister"


@dataclass(frozen=True)
class Leaving:
    kind = "leaving"


@dataclass(frozen=True)
class Drain:
    kind = "drain"


@dataclass(frozen=True)
class Resume:
    kind = "resume"


@dataclass(frozen=True)
class Heartbeat:
    kind = "heartbeat"
    info: dict       # engine_info: live limits and page states
    counters: dict   # worker events
    control: dict    # the control plane's accepted/dropped counts


# --- a request's life -------------------------------------------------------

@dataclass(frozen=True)
class Assign:
    kind = "assign"
    request_id: RequestId
    ticket: SignedTicket


@dataclass(frozen=True)
class PrefillReady:
    """The prompt's KV exists at prefill; decode grants pages only now, so
    the writer starts at once (the model's decode grants at the ticket)."""
    kind = "prefill_ready"
    request_id: RequestId


@dataclass(frozen=True)
class Endpoint:
    """Where a writer writes: a transfer backend and its descriptor (the
    model's: the decode worker's index and incarnation)."""
    backend: str
    descriptor: typing.Any


@dataclass(frozen=True)
class PagesGranted:
    """A write at another generation than the ledger's is refused."""
    kind = "pages_granted"
    request_id: RequestId
    room: int
    epoch: int
    pages: tuple[int, ...]
    generations: tuple[int, ...]   # the ledger's, one per page
    transfer: Endpoint             # decode's endpoint
    # Prefill starts no write for this grant after this many seconds, so a
    # writer that never acks is done long before decode's lease ends (the
    # model has no clock: inf).
    write_within_s: float


@dataclass(frozen=True)
class TransferDone:
    kind = "transfer_done"
    request_id: RequestId
    manifest: Manifest
    first_token: int                            # the model: 0
    first_logprobs: tuple[TokenLogprobs, ...]   # () or the first token's
    sampler_state: bytes | None                 # the sampler's generator state (seeded sampling continues)
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()  # echo's, prefill computed them; decode sends them first


@dataclass(frozen=True)
class DrainAck:
    """No write for this request is in flight and none will be posted
    again; decode may free the pages."""
    kind = "drain_ack"
    request_id: RequestId


@dataclass(frozen=True)
class Finalize:
    """Workers record it, stop work and release resources (decode only
    after the prefill's drain ack)."""
    kind = "finalize"
    request_id: RequestId
    outcome: Outcome


@dataclass(frozen=True)
class Output:
    """A finished one without an error is the 200 (the model's carries no
    tokens)."""
    kind = "output"
    output: RequestOutput

    @property
    def request_id(self):
        return self.output.request_id


@dataclass(frozen=True)
class PrefillFailed:
    """Prefill could not compute the prompt. The REAL router fails the
    request; LEGACY's prefill sends it as its own 400 for a prompt over its
    limit, and the legacy router drops it (the incident)."""
    kind = "prefill_failed"
    request_id: RequestId
    reason: str
    code: str | None = None


@dataclass(frozen=True)
class TransferFailed:
    kind = "transfer_failed"
    request_id: RequestId
    reason: str
    code: str | None = None


MESSAGES = (Register, Registered, Refused, Reregister, Leaving, Drain, Resume, Heartbeat, Assign, PrefillReady,
            PagesGranted, TransferDone, DrainAck, Finalize, Output, PrefillFailed, TransferFailed)
BY_KIND = {cls.kind: cls for cls in MESSAGES}
Message = typing.Union[MESSAGES]  # noqa: UP007 - a runtime tuple of types
