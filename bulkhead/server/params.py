"""Validate request bodies into engine parameters, before any page exists."""

from __future__ import annotations

import re

from bulkhead.engine.admission import Limits
from bulkhead.engine.request import SamplingParams
from bulkhead.errors import InvalidRequest
from bulkhead.server.schemas import ChatCompletionRequest, CompletionRequest, _SamplingFields

MAX_STOP_STRINGS = 16
# torch seeds a generator from a 64-bit integer; a seed beyond int64 would
# fail the engine step that samples it (and with it every request in the batch).
SEED_RANGE = (-(2**63), 2**63 - 1)
# Below this a temperature divides logits into infinities; like vLLM, sample greedily instead.
GREEDY_BELOW = 1e-5
# max_tokens for a request that names none (`serve --default-max-tokens`).
# Not "the rest of the context" (vLLM's choice): a small model that falls
# into a loop then runs for minutes (issue 16 saw 7,458 tokens in 5 minutes
# for the README's own example), which a client's timeout and retries turn
# into a server that looks hung. 512 tokens is an answer in seconds here;
# finish_reason "length" says when it cut one short.
DEFAULT_MAX_TOKENS = 512
# vLLM takes any positive repetition_penalty; past this a logit is scaled by
# more than two orders of magnitude, which no sampling setting needs.
MAX_REPETITION_PENALTY = 100.0


def _bad(message: str, param: str, *, limit=None, value=None, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code, limit=limit, value=value)


def _check_token_id(token_id: int, limits: Limits, param: str) -> None:
    if not 0 <= token_id < limits.vocab_size:
        raise _bad(
            f"{param}: token id {token_id} is outside the vocabulary [0, {limits.vocab_size})",
            param, limit=limits.vocab_size - 1, value=token_id, code="invalid_token_id",
        )


def _unsupported(body: _SamplingFields) -> None:
    """One policy for both endpoints, as OpenAI answers an argument it does
    not know: a field the schema does not declare is a 400 naming it, never
    dropped in silence (its client expects it to change the answer).
    schemas.py says why each accepted-and-ignored field cannot."""
    for name in body.model_extra or {}:  # pydantic already refused a name that is not valid Unicode
        raise _bad(f"{name!r} is not a supported parameter (docs/api.md, 'Request fields', lists what is served, "
                   "accepted and ignored, and refused)", name, code="unsupported_parameter")
    if isinstance(body, CompletionRequest):
        if body.suffix:
            raise _bad("suffix is not supported", "suffix", code="unsupported_parameter")
        if body.best_of not in (None, body.n):
            raise _bad("best_of other than n is not supported", "best_of", value=body.best_of,
                       code="unsupported_parameter")


def requested_max_tokens(body: _SamplingFields) -> int | None:
    if isinstance(body, ChatCompletionRequest):
        return body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return body.max_tokens


def _check_unicode(value, param: str | None = None) -> None:
    """JSON may escape a lone surrogate (\\ud800) that no tokenizer (nor the
    JSON encoder of an error message) can encode: refuse it, naming the field."""
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise _bad(f"{param}: text holds an unpaired surrogate {value[e.start]!r} at character {e.start}; "
                           "it must be valid Unicode", param, code="invalid_unicode") from None
    elif isinstance(value, (list, tuple)):
        if value and not isinstance(value[0], int):  # token ids: nothing to check
            for item in value:
                _check_unicode(item, param)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_unicode(key, param)
            _check_unicode(item, param)
    elif hasattr(value, "__dict__"):  # the body, or a nested model (messages, content parts)
        for key, item in vars(value).items():
            _check_unicode(item, param or key)


def validate_common(body: _SamplingFields, limits: Limits) -> None:
    """Every check that does not depend on the prompt's length."""
    _check_unicode(body)
    _unsupported(body)
    max_tokens = requested_max_tokens(body)
    if max_tokens is not None and max_tokens < 1 and not (max_tokens == 0 and prompt_only(body)):
        raise _bad(f"max_tokens must be at least 1 (0 only with echo: the prompt alone), got {max_tokens}",
                   "max_tokens", limit=1, value=max_tokens)
    if not 1 <= body.n <= limits.max_n:
        raise _bad(f"n must be between 1 and {limits.max_n}, got {body.n}", "n", limit=limits.max_n, value=body.n)
    if body.temperature is not None and not 0.0 <= body.temperature <= 2.0:
        raise _bad(f"temperature must be in [0, 2], got {body.temperature}", "temperature", limit=2.0,
                   value=body.temperature)
    if body.seed is not None and not SEED_RANGE[0] <= body.seed <= SEED_RANGE[1]:
        raise _bad(f"seed must be a 64-bit signed integer, got {body.seed}", "seed", limit=SEED_RANGE[1],
                   value=body.seed)
    if body.top_p is not None and not 0.0 < body.top_p <= 1.0:
        raise _bad(f"top_p must be in (0, 1], got {body.top_p}", "top_p", limit=1.0, value=body.top_p)
    if body.top_k is not None and body.top_k < -1:
        raise _bad(f"top_k must be -1, 0 (off) or positive, got {body.top_k}", "top_k", value=body.top_k)
    if body.min_tokens < 0 or (max_tokens is not None and body.min_tokens > max_tokens):
        raise _bad(f"min_tokens must be in [0, max_tokens], got {body.min_tokens}", "min_tokens",
                   limit=max_tokens, value=body.min_tokens)
    stops = _stop_list(body)
    if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
        raise _bad(f"stop takes at most {MAX_STOP_STRINGS} non-empty strings", "stop", limit=MAX_STOP_STRINGS,
                   value=len(stops))
    for t in body.stop_token_ids or ():
        _check_token_id(t, limits, "stop_token_ids")
    for key, bias in (body.logit_bias or {}).items():
        try:
            token_id = int(key)
        except ValueError:
            raise _bad(f"logit_bias keys must be token ids, got {key!r}", "logit_bias") from None
        _check_token_id(token_id, limits, "logit_bias")
        if not -100 <= bias <= 100:
            raise _bad(f"logit_bias values must be in [-100, 100], got {bias}", "logit_bias", limit=100, value=bias)
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(body, name)
        if value is not None and not -2.0 <= value <= 2.0:
            raise _bad(f"{name} must be in [-2, 2], got {value}", name, limit=2.0, value=value)
    if body.repetition_penalty is not None and not 0.0 < body.repetition_penalty <= MAX_REPETITION_PENALTY:
        raise _bad(f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY:g}], got {body.repetition_penalty}",
                   "repetition_penalty", limit=MAX_REPETITION_PENALTY, value=body.repetition_penalty)
    k = _logprobs_k(body)
    if k is not None and not 0 <= k <= limits.max_logprobs:
        param = "top_logprobs" if isinstance(body, ChatCompletionRequest) else "logprobs"
        raise _bad(f"{param} must be in [0, {limits.max_logprobs}], got {k}", param, limit=limits.max_logprobs,
                   value=k)


def _stop_list(body: _SamplingFields) -> list[str]:
    if body.stop is None:
        return []
    return [body.stop] if isinstance(body.stop, str) else list(body.stop)


def _logprobs_k(body: _SamplingFields) -> int | None:
    if isinstance(body, ChatCompletionRequest):
        if body.top_logprobs is not None and not body.logprobs:
            raise _bad("top_logprobs needs logprobs=true", "top_logprobs")
        return (body.top_logprobs or 0) if body.logprobs else None
    return body.logprobs


def prompt_only(body: _SamplingFields) -> bool:
    """echo with max_tokens 0 (vLLM's, and how evaluation harnesses score a
    prompt): the answer is the prompt and its logprobs, no completion. The
    engine still samples one token, which the HTTP layer drops: prefill is
    what computes the prompt's logprobs, and it ends by sampling."""
    return bool(getattr(body, "echo", False)) and requested_max_tokens(body) == 0


def sampling_params(body: _SamplingFields, prompt_len: int, limits: Limits, choice: int,
                    defaults: dict | None = None, default_max_tokens: int = DEFAULT_MAX_TOKENS,
                    grammar: str | None = None) -> SamplingParams:
    """Params for one choice of one prompt. A request without max_tokens gets
    `default_max_tokens` (at least its min_tokens), or the rest of the context
    where that is less or the default is 0; unnamed temperature/top_p/top_k
    come from the model's generation_config.json (`defaults`), else OpenAI's."""
    defaults = defaults or {}
    max_tokens = 1 if prompt_only(body) else requested_max_tokens(body)
    if max_tokens is None:
        max_tokens = max(1, limits.effective_context - prompt_len)
        if default_max_tokens > 0:
            max_tokens = min(max_tokens, max(default_max_tokens, body.min_tokens))
    temperature = defaults.get("temperature", 1.0) if body.temperature is None else body.temperature
    if temperature < GREEDY_BELOW:
        temperature = 0.0
    seed = None if body.seed is None else body.seed + choice
    top_k = defaults.get("top_k", 0) if body.top_k is None else body.top_k
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=defaults.get("top_p", 1.0) if body.top_p is None else body.top_p,
        top_k=max(0, top_k),
        seed=seed,
        min_tokens=body.min_tokens,
        stop=tuple(_stop_list(body)),
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=body.ignore_eos,
        logprobs=_logprobs_k(body),
        # echo with logprobs: the prompt's too (completions only; chat has no echo)
        prompt_logprobs=_logprobs_k(body) if getattr(body, "echo", False) else None,
        logit_bias=tuple((int(k), float(v)) for k, v in (body.logit_bias or {}).items()),
        presence_penalty=float(body.presence_penalty or 0.0),
        frequency_penalty=float(body.frequency_penalty or 0.0),
        repetition_penalty=1.0 if body.repetition_penalty is None else float(body.repetition_penalty),
        grammar=grammar,
    )


def completion_prompts(body: CompletionRequest, limits: Limits, encode) -> list[list[int]]:
    p = body.prompt
    if isinstance(p, str):
        prompts = [encode(p)]
    elif p and all(isinstance(x, int) for x in p):
        prompts = [list(p)]
    elif p and all(isinstance(x, str) for x in p):
        prompts = [encode(x) for x in p]
    elif p and all(isinstance(x, list) for x in p):
        prompts = [list(x) for x in p]
    else:
        raise _bad("prompt must be a string, a list of strings, or token ids", "prompt")
    for ids in prompts:
        if not ids:
            raise _bad("the prompt is empty", "prompt", code="empty_prompt")
        for t in ids:
            _check_token_id(t, limits, "prompt")
    if len(prompts) * body.n > limits.max_n * 4:
        raise _bad(f"at most {limits.max_n * 4} completions per request (prompts x n)", "prompt",
                   limit=limits.max_n * 4, value=len(prompts) * body.n)
    return prompts


def chat_messages(body: ChatCompletionRequest) -> list[dict]:
    messages = []
    for m in body.messages:
        content = m.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        message = {"role": "system" if m.role == "developer" else m.role, "content": content or ""}
        if m.tool_calls:
            message["tool_calls"] = [c.model_dump(exclude_none=True) for c in m.tool_calls]
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        messages.append(message)
    return messages


# Pydantic names union members in an error's location ("prompt.list[int].0");
# the client named only the field.
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|[A-Za-z_]+\[.*\])$")


def schema_error(errors: list[dict]) -> InvalidRequest:
    """The first schema violation as a typed 400 naming the parameter (never
    FastAPI's default 422 `detail` list, which no OpenAI client reads)."""
    first = errors[0] if errors else {}
    kind = first.get("type", "")
    if kind == "json_invalid":
        where = first.get("loc", ("body", 0))[-1]
        reason = first.get("ctx", {}).get("error", "JSON decode error")
        return _bad(f"the body is not valid JSON: {reason} at character {where}", None, code="invalid_json")
    loc = [str(x) for x in first.get("loc", ()) if x != "body" and not _UNION_TAG.match(str(x))]
    param = ".".join(loc) or None
    if kind == "missing":
        code = "missing_parameter"
    elif any(s in kind for s in ("type", "parsing", "literal", "int_from_float")):
        code = "invalid_type"
    else:
        code = "invalid_value"
    return _bad(f"{param or 'body'}: {first.get('msg', 'invalid request')}", param, code=code)
