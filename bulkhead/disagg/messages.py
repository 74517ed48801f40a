"""The wire codec for the protocol's messages (bulkhead.protocol.messages:
one frozen type per message, the same classes the model checker explores).

    encode(message) -> dict     the JSON object the link seals and signs
    decode(dict)    -> message  or MalformedMessage: an unknown kind, a
                                missing field or one of the wrong type

A change to a message is a change to its class in bulkhead.protocol.messages:
the sender builds it, the receiver's dispatch table (`handler_for`) picks
its handler by type, and nobody edits a dict literal. Receivers drop and
count what does not decode, as the control plane drops a bad MAC; no
message can raise out of a link's loop. The types are re-exported here, so
`messages.Assign` is `bulkhead.protocol.messages.Assign`. The codec lives
on this side of the package line because it builds the engine's values
(the ticket's Admitted decision, an output's typed error).
"""

from __future__ import annotations

import base64
from dataclasses import MISSING, fields

from bulkhead.disagg.ticket import signed_ticket_from_dict, signed_ticket_to_dict
from bulkhead.engine.outputs import RequestOutput, TokenLogprobs
from bulkhead.disagg.wire_errors import error_from_wire
from bulkhead.protocol.manifest import Manifest
from bulkhead.protocol.messages import (  # noqa: F401 - the message types, re-exported
    BY_KIND, MESSAGES, Assign, DrainAck, Drain, Endpoint, Finalize, Heartbeat, Leaving, Message, Output,
    PagesGranted, PrefillFailed, PrefillReady, Refused, Register, Registered, Reregister, Resume, TransferDone,
    TransferFailed,
)
from bulkhead.protocol.types import Outcome


class MalformedMessage(ValueError):
    """A control message that is not exactly one of the kinds in bulkhead.protocol.messages."""


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


def _nested(from_json, kind=dict):
    def parse(v):
        try:
            return from_json(_typed(kind)(v))
        except MalformedMessage:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise MalformedMessage(f"{from_json.__qualname__}: {e!r}") from e
    return parse


def _logprobs_to_list(items) -> list:
    return [[lp.token_id, lp.logprob, [list(x) for x in lp.top]] for lp in items]


def _logprobs_from_list(items) -> tuple[TokenLogprobs, ...]:
    return tuple(TokenLogprobs(int(t), float(lp), tuple((int(a), float(b)) for a, b in top)) for t, lp, top in items)


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
        e = d["error"]
        error = error_from_wire(e.get("message", "worker error"), e.get("code"), e.get("status", 500), e.get("param"))
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


def _endpoint_from_dict(d: dict) -> Endpoint:
    return Endpoint(_typed(str)(d["backend"]), d["descriptor"])


def _endpoint_to_dict(e: Endpoint) -> dict:
    return {"backend": e.backend, "descriptor": e.descriptor}


def _outcome(v) -> Outcome:
    try:
        return Outcome(_typed(str)(v))
    except ValueError:
        raise MalformedMessage(f"unknown outcome {v!r}") from None


# Keyed by the annotation, as the message classes spell it (RequestId: a
# string on the wire).
_DECODERS = {
    "str": _typed(str), "int": _int, "float": _number, "dict": _typed(dict), "list": _typed(list),
    "RequestId": _typed(str), "Outcome": _outcome, "Endpoint": _nested(_endpoint_from_dict),
    "tuple[int, ...]": _ints, "str | None": _optional(_typed(str)), "dict | None": _optional(_typed(dict)),
    "SignedTicket": _nested(signed_ticket_from_dict), "Manifest": _nested(Manifest.from_dict),
    "RequestOutput": _nested(_output_from_dict), "tuple[TokenLogprobs, ...]": _nested(_logprobs_from_list, list),
    "bytes | None": _optional(_unb64),
}
_ENCODERS = {
    "tuple[int, ...]": list, "SignedTicket": signed_ticket_to_dict, "Manifest": Manifest.to_dict,
    "Outcome": lambda o: o.value, "Endpoint": _endpoint_to_dict,
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
