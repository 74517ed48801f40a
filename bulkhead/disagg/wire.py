"""Engine outputs (and their logprobs and errors) as JSON and back."""

from __future__ import annotations

import base64

from bulkhead.engine.outputs import RequestOutput, TokenLogprobs
from bulkhead.errors import BulkheadError, EngineFailure


def logprobs_to_list(items) -> list:
    return [[lp.token_id, lp.logprob, [list(x) for x in lp.top]] for lp in items]


def logprobs_from_list(items) -> tuple[TokenLogprobs, ...]:
    return tuple(TokenLogprobs(t, lp, tuple((int(a), float(b)) for a, b in top)) for t, lp, top in items)


def output_to_dict(out: RequestOutput) -> dict:
    return {
        "request_id": out.request_id, "token_ids": list(out.token_ids), "text": out.text,
        "logprobs": logprobs_to_list(out.logprobs), "finished": out.finished,
        "finish_reason": out.finish_reason, "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.completion_tokens,
        "error": None if out.error is None else {"status": out.error.status, **out.error.to_dict()["error"]},
    }


def output_from_dict(d: dict) -> RequestOutput:
    error = None
    if d["error"] is not None:
        error = error_from_dict(d["error"])
    return RequestOutput(d["request_id"], tuple(d["token_ids"]), d["text"], logprobs_from_list(d["logprobs"]),
                         d["finished"], d["finish_reason"], d["prompt_tokens"], d["completion_tokens"], error)


def error_from_dict(d: dict) -> BulkheadError:
    err = EngineFailure(d.get("message", "worker error"), code=d.get("code"))
    err.status = int(d.get("status", 500))
    return err


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)
