"""Every control-plane message between the router and its workers, as one
frozen type each, with one codec.

    encode(message) -> dict     the JSON object the link seals and signs
    decode(dict)    -> message  or MalformedMessage: an unknown kind, a
                                missing field or one of the wrong type

A change to a message is a change to its class here: the sender builds it,
the receiver's dispatch table (`handler_for`) picks its handler by type,
and nobody edits a dict literal. Receivers drop and count what does not
decode, as the control plane drops a bad MAC; no message can raise out of
a link's loop.

    message        from -> to                 means
    -------------  -------------------------  ------------------------------------------------
    Register       worker -> router           my live limits (and decode's transfer endpoint)
    Registered     router -> worker           you passed the pairing gate
    Refused        router -> worker           you did not, and why
    Reregister     router -> worker           I do not know you: end your jobs, register again
    Heartbeat      worker -> router           live limits, page states and counters (and whether drained)
    Leaving        worker -> router           I am shutting down (SIGTERM): drain me
    Drain          router -> worker           no assignment follows this one: finish what you hold
    Resume         router -> worker           you may be assigned again
    Assign         router -> both workers     the signed admission ticket
    PrefillReady   prefill -> router -> decode  the prompt's KV exists: grant pages now
    PagesGranted   decode -> router -> prefill  pages and generations to write, and where
    TransferDone   prefill -> router -> decode  the manifest, the first token, sampler state
    DrainAck       prefill -> router -> decode  no write of mine can still land
    Finalize       router -> both workers     the request's one outcome
    Output         decode -> router           tokens (or the error) for the client
    PrefillFailed  prefill -> router          the prompt could not be prefilled
    TransferFailed worker -> router           the KV could not be moved or verified
"""

from __future__ import annotations

import base64
import typing
from dataclasses import MISSING, dataclass, fields

from bulkhead.protocol.manifest import Manifest
from bulkhead.disagg.ticket import SignedTicket
from bulkhead.engine.outputs import RequestOutput, TokenLogprobs
from bulkhead.errors import EngineFailure


class MalformedMessage(ValueError):
    """A control message that is not exactly one of the kinds below."""


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


@dataclass(frozen=True)
class Assign:
    kind = "assign"
    request_id: str
    ticket: SignedTicket


@dataclass(frozen=True)
class PrefillReady:
    kind = "prefill_ready"
    request_id: str


@dataclass(frozen=True)
class PagesGranted:
    kind = "pages_granted"
    request_id: str
    room: int
    epoch: int
    pages: tuple[int, ...]
    generations: tuple[int, ...]   # the ledger's, one per page: a write at another is refused
    transfer: dict                 # decode's endpoint: {"backend", "descriptor"}
    # Prefill starts no write for this grant after this many seconds, so a
    # writer that never acks is done long before decode's lease ends.
    write_within_s: float


@dataclass(frozen=True)
class TransferDone:
    kind = "transfer_done"
    request_id: str
    manifest: Manifest
    first_token: int
    first_logprobs: tuple[TokenLogprobs, ...]   # () or the first token's
    sampler_state: bytes | None                 # the sampler's generator state (seeded sampling continues)
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()  # echo's, prefill computed them; decode sends them first


@dataclass(frozen=True)
class DrainAck:
    kind = "drain_ack"
    request_id: str


@dataclass(frozen=True)
class Finalize:
    kind = "finalize"
    request_id: str
    outcome: str


@dataclass(frozen=True)
class Output:
    kind = "output"
    output: RequestOutput

    @property
    def request_id(self) -> str:
        return self.output.request_id


@dataclass(frozen=True)
class PrefillFailed:
    kind = "prefill_failed"
    request_id: str
    reason: str
    code: str | None = None


@dataclass(frozen=True)
class TransferFailed:
    kind = "transfer_failed"
    request_id: str
    reason: str
    code: str | None = None


MESSAGES = (Register, Registered, Refused, Reregister, Leaving, Drain, Resume, Heartbeat, Assign, PrefillReady,
            PagesGranted, TransferDone, DrainAck, Finalize, Output, PrefillFailed, TransferFailed)
BY_KIND = {cls.kind: cls for cls in MESSAGES}
Message = typing.Union[MESSAGES]  # noqa: UP007 - a runtime tuple of types


# -- codec -----------------------------------------------------------------------
# How a field of each declared type goes to JSON and comes back (checked).

def _int(v):
    if isinstance(v, bool) or not isinstance(v, int):
        raise MalformedMessage(f"expected an integer, got {type(v).__name__}")
    return v


def _typed(kind):
    def check(v):
        if not isinstance(v, kind):
            raise MalformedMessage(f"expected {kind.__name__}, got {type(v).__name__}")
        return v
    return check


def _number(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise MalformedMessage(f"expected a number, got {type(v).__name__}")
    return float(v)


def _ints(v):
    return tuple(_int(x) for x in _typed(list)(v))


def _optional(parse):
    return lambda v: None if v is None else parse(v)


def _nested_list(from_list):
    def parse(v):
        try:
            return from_list(v)
        except MalformedMessage:
            raise
        except (TypeError, ValueError) as e:
            raise MalformedMessage(f"{from_list.__name__}: {e!r}") from e
    return parse


def _nested(from_dict):
    def parse(v):
        try:
            return from_dict(_typed(dict)(v))
        except MalformedMessage:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise MalformedMessage(f"{from_dict.__qualname__}: {e!r}") from e
    return parse


def _logprobs_to_list(items) -> list:
    return [[lp.token_id, lp.logprob, [list(x) for x in lp.top]] for lp in items]


def _logprobs_from_list(items) -> tuple[TokenLogprobs, ...]:
    return tuple(TokenLogprobs(int(t), float(lp), tuple((int(a), float(b)) for a, b in top))
                 for t, lp, top in _typed(list)(items))


def _output_to_dict(out: RequestOutput) -> dict:
    return {
        "request_id": out.request_id, "token_ids": list(out.token_ids), "text": out.text,
        "logprobs": _logprobs_to_list(out.logprobs), "finished": out.finished,
        "finish_reason": out.finish_reason, "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.completion_tokens, "prompt_logprobs": _logprobs_to_list(out.prompt_logprobs),
        "error": None if out.error is None else {"status": out.error.status, **out.error.to_dict()["error"]},
    }


def _output_from_dict(d: dict) -> RequestOutput:
    error = None
    if d["error"] is not None:  # the worker's typed error, with its status, code and message
        error = EngineFailure(d["error"].get("message", "worker error"), code=d["error"].get("code"))
        error.status = int(d["error"].get("status", 500))
    return RequestOutput(d["request_id"], tuple(d["token_ids"]), d["text"], _logprobs_from_list(d["logprobs"]),
                         d["finished"], d["finish_reason"], d["prompt_tokens"], d["completion_tokens"], error,
                         prompt_logprobs=_logprobs_from_list(d.get("prompt_logprobs", [])))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text) -> bytes:
    try:
        return base64.b64decode(_typed(str)(text), validate=True)
    except ValueError as e:
        raise MalformedMessage(f"not base64: {e}") from e


_DECODERS = {
    "str": _typed(str), "int": _int, "float": _number, "dict": _typed(dict), "list": _typed(list),
    "tuple[int, ...]": _ints, "str | None": _optional(_typed(str)), "dict | None": _optional(_typed(dict)),
    "SignedTicket": _nested(SignedTicket.from_dict), "Manifest": _nested(Manifest.from_dict),
    "RequestOutput": _nested(_output_from_dict), "tuple[TokenLogprobs, ...]": _nested_list(_logprobs_from_list),
    "bytes | None": _optional(_unb64),
}
_ENCODERS = {
    "tuple[int, ...]": list, "SignedTicket": SignedTicket.to_dict, "Manifest": Manifest.to_dict,
    "RequestOutput": _output_to_dict, "tuple[TokenLogprobs, ...]": _logprobs_to_list, "bytes | None": _b64,
}


def encode(message) -> dict:
    """The JSON object for one message: {"kind": ..., field: value, ...}."""
    body = {"kind": message.kind}
    for f in fields(message):
        value = getattr(message, f.name)
        encoder = _ENCODERS.get(f.type)
        body[f.name] = value if encoder is None or value is None else encoder(value)
    return body


def decode(body: dict):
    """The message a sealed JSON object carries. Envelope keys (`_from`,
    `_inc`, `_seq`, `_ts`: the signer's) are ignored; any other key that the
    kind does not have is malformed, as is a missing or mistyped field."""
    if not isinstance(body, dict):
        raise MalformedMessage(f"a message is a JSON object, not {type(body).__name__}")
    cls = BY_KIND.get(body.get("kind"))
    if cls is None:
        raise MalformedMessage(f"unknown kind {body.get('kind')!r}")
    known = {f.name for f in fields(cls)}
    extra = {k for k in body if k != "kind" and not k.startswith("_")} - known
    if extra:
        raise MalformedMessage(f"{cls.kind}: unknown fields {sorted(extra)}")
    values = {}
    for f in fields(cls):
        if f.name not in body:
            if f.default is MISSING:
                raise MalformedMessage(f"{cls.kind}: missing {f.name}")
            continue
        try:
            values[f.name] = _DECODERS[f.type](body[f.name])
        except MalformedMessage as e:
            raise MalformedMessage(f"{cls.kind}.{f.name}: {e}") from None
    return cls(**values)


def handler_for(table: dict, message):
    """The handler a dispatch table names for this message's type, or None
    (a kind this actor does not take: dropped and counted by the caller)."""
    return table.get(type(message))
