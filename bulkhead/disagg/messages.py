"""The wire codec for the protocol's messages (bulkhead.protocol.messages:
one frozen type per message, the same classes the model checker explores).

    encode(message) -> dict     the JSON object the link seals and signs
    decode(dict)    -> message  or MalformedMessage: an unknown kind, a
                                missing field or one of the wrong type

Receivers drop and count what does not decode, as the control plane drops a
bad MAC; no message can raise out of a link's loop. The types are
re-exported here. The codec lives on this side of the package line because
it builds the engine's values (the ticket's Admitted decision, an output's
typed error).
"""

from __future__ import annotations

import base64
import functools
from dataclasses import MISSING, fields

from bulkhead.disagg.ticket import signed_ticket_from_dict, signed_ticket_to_dict
from bulkhead.engine.outputs import RequestOutput, TokenLogprobs
from bulkhead.errors import AdapterUnavailable, BulkheadError, EngineFailure, Overloaded
from bulkhead.protocol.manifest import Manifest
from bulkhead.protocol.messages import (  # noqa: F401 - the message types, re-exported
    BY_KIND, MESSAGES, Assign, DrainAck, Drain, Endpoint, Finalize, Heartbeat, Leaving, Message, Output,
    PagesGranted, PrefillFailed, PrefillReady, Refused, Register, Registered, Reregister, Resume, TransferDone,
    TransferFailed,
)
from bulkhead.protocol.types import Outcome

# The errors a worker's engine refuses a request with by design: the router
# rebuilds their class from the code, so the client gets the error the
# worker decided (class, status, type and code), not a generic failure.
ERRORS_BY_CODE: dict[str, type[BulkheadError]] = {cls.code: cls for cls in (AdapterUnavailable, Overloaded)}


class MalformedMessage(ValueError):
    """A control message that is not exactly one of the kinds in bulkhead.protocol.messages."""


def error_from_wire(message: str, code: str | None, status: int | None = None,
                    param: str | None = None) -> BulkheadError:
    """A worker's typed error, rebuilt on the router's side; any code not in
    ERRORS_BY_CODE is an EngineFailure keeping the worker's code and status."""
    cls = ERRORS_BY_CODE.get(code or "")
    if cls is not None:
        return cls(message, param=param)
    error = EngineFailure(message, code=code, param=param)
    if status is not None:
        error.status = int(status)
    return error


# -- codec -----------------------------------------------------------------------
# How a field of each declared type goes to JSON and comes back (checked).

def _typed(*kinds, what: str = ""):
    no_bool = bool not in kinds  # a bool is an int to isinstance, never on the wire

    def check(v):
        if not isinstance(v, kinds) or (no_bool and v.__class__ is bool):
            raise MalformedMessage(f"expected {what or kinds[0].__name__}, got {type(v).__name__}")
        return v
    return check


_INT, _NUMBER, _LIST = _typed(int, what="an integer"), _typed(int, float, what="a number"), _typed(list)


def _ints(v):
    return tuple(_INT(x) for x in _LIST(v))


def _optional(parse):
    return lambda v: None if v is None else parse(v)


def _nested(from_json, kind=dict):
    typed = _typed(kind)

    def parse(v):
        try:
            return from_json(typed(v))
        except MalformedMessage:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise MalformedMessage(f"{from_json.__qualname__}: {e!r}") from e
    return parse


def _logprobs_to_list(items) -> list:
    return [[lp.token_id, lp.logprob, [list(x) for x in lp.top]] for lp in items]


def _logprobs_from_list(items) -> tuple[TokenLogprobs, ...]:
    return tuple(TokenLogprobs(int(t), float(lp), tuple((int(a), float(b)) for a, b in top)) for t, lp, top in items)


def _error_to_dict(error: BulkheadError) -> dict:
    return {"status": error.status, **error.to_dict()["error"]}


def _error_from_dict(e: dict) -> BulkheadError:  # the worker's typed error, with its status, code and message
    return error_from_wire(e.get("message", "worker error"), e.get("code"), e.get("status", 500), e.get("param"))


def _unb64(text) -> bytes:
    try:
        return base64.b64decode(_typed(str)(text), validate=True)
    except ValueError as e:
        raise MalformedMessage(f"not base64: {e}") from None


def _outcome(v) -> Outcome:
    try:
        return Outcome(_typed(str)(v))
    except ValueError:
        raise MalformedMessage(f"unknown outcome {v!r}") from None


# An Output's request output leaves its prefill-only fields (held pages, sampler state) behind.
_OUTPUT_SKIPS = ("held_pages", "sampler_state")

# Keyed by the annotation, as the message classes spell it (RequestId: a
# string on the wire).
_DECODERS = {
    "str": _typed(str), "int": _INT, "float": lambda v: float(_NUMBER(v)), "bool": _typed(bool), "dict": _typed(dict),
    "list": _typed(list), "RequestId": _typed(str), "Outcome": _outcome,
    "Endpoint": _nested(lambda d: Endpoint(_typed(str)(d["backend"]), d["descriptor"])),
    "tuple[int, ...]": _ints, "str | None": _optional(_typed(str)), "dict | None": _optional(_typed(dict)),
    "SignedTicket": _nested(signed_ticket_from_dict), "Manifest": _nested(Manifest.from_dict),
    "RequestOutput": _nested(lambda d: RequestOutput(**_values(RequestOutput, d, "output", _OUTPUT_SKIPS))),
    "tuple[TokenLogprobs, ...]": _nested(_logprobs_from_list, list), "bytes | None": _optional(_unb64),
    "BulkheadError | None": _optional(_nested(_error_from_dict)),
}
_ENCODERS = {
    "tuple[int, ...]": list, "SignedTicket": signed_ticket_to_dict, "Manifest": Manifest.to_dict,
    "Outcome": lambda o: o.value, "Endpoint": lambda e: {"backend": e.backend, "descriptor": e.descriptor},
    "RequestOutput": lambda out: _fields(out, _OUTPUT_SKIPS), "tuple[TokenLogprobs, ...]": _logprobs_to_list,
    "bytes | None": lambda b: base64.b64encode(b).decode(), "BulkheadError | None": _error_to_dict,
}


@functools.cache
def _codec(cls, skip=()) -> tuple[tuple[str, object, object, bool], ...]:
    """(name, encoder or None, decoder, required) per field of cls (a message's codec runs per token)."""
    return tuple((f.name, _ENCODERS.get(f.type), _DECODERS[f.type], f.default is MISSING)
                 for f in fields(cls) if f.name not in skip)


def _fields(obj, skip=()) -> dict:
    body = {}
    for name, encoder, _, _ in _codec(type(obj), skip):
        value = getattr(obj, name)
        body[name] = value if encoder is None or value is None else encoder(value)
    return body


def _values(cls, body: dict, what: str, skip=()) -> dict:
    """cls's fields from body, each decoded by its type; a missing field
    takes its default, or is malformed without one."""
    values = {}
    for name, _, decoder, required in _codec(cls, skip):
        if name not in body:
            if required:
                raise MalformedMessage(f"{what}: missing {name}")
            continue
        try:
            values[name] = decoder(body[name])
        except MalformedMessage as e:
            raise MalformedMessage(f"{what}.{name}: {e}") from None
    return values


def encode(message) -> dict:
    """The JSON object for one message: {"kind": ..., field: value, ...}."""
    return {"kind": message.kind, **_fields(message)}


def decode(body: dict):
    """The message a sealed JSON object carries. Envelope keys (`_from`,
    `_inc`, `_seq`, `_ts`: the signer's) are ignored; any other key that the
    kind does not have is malformed, as is a missing or mistyped field."""
    if not isinstance(body, dict):
        raise MalformedMessage(f"a message is a JSON object, not {type(body).__name__}")
    cls = BY_KIND.get(body.get("kind"))
    if cls is None:
        raise MalformedMessage(f"unknown kind {body.get('kind')!r}")
    extra = {k for k in body if k != "kind" and not k.startswith("_")} - {name for name, *_ in _codec(cls)}
    if extra:
        raise MalformedMessage(f"{cls.kind}: unknown fields {sorted(extra)}")
    return cls(**_values(cls, body, cls.kind))
