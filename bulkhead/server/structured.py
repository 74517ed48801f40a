"""A request's output constraint: `response_format`, vLLM's `guided_*`, or its
tools, as one llguidance grammar (text), checked against the model's
vocabulary before anything is admitted: a schema the library cannot compile
is a 400 naming the field and its reason. The grammar rides in the sampling
parameters to whichever engine samples (engine/grammar_mask.py). Torch-free.
"""

from __future__ import annotations

import threading

from bulkhead.errors import InvalidRequest
from bulkhead.model import guidance
from bulkhead.server import tools as tool_calls
from bulkhead.server.schemas import ChatCompletionRequest, _SamplingFields

# vLLM's guided_choice takes any list; this many alternatives is already a
# classifier with more labels than any prompt names.
MAX_CHOICES = 1024


def _bad(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


class GrammarCompiler:
    """Compiles and checks grammars against one model's vocabulary (built on first use, ~0.4 s)."""

    def __init__(self, tokenizer, vocab_size):
        """vocab_size: a callable; a router learns it only once a worker pair registers."""
        self._source = tokenizer
        self._vocab_size = vocab_size
        self._tok = None
        self._lock = threading.Lock()

    def check(self, grammar: str, param: str) -> str:
        with self._lock:
            if self._tok is None:
                self._tok = guidance.tokenizer(self._source.to_json(), self._vocab_size(), ())
        _compiled(param, lambda: guidance.check(grammar, self._tok))
        return grammar


def _response_format(body: _SamplingFields) -> str | None:
    rf = body.response_format if isinstance(body, ChatCompletionRequest) else None
    if not rf:
        return None
    kind = rf.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return guidance.json_schema({"type": "object"})
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), (dict, bool)):
            raise _bad("response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}",
                       "response_format")
        if "schema" not in spec:  # OpenAI refuses it too; treated as "anything", it answered `null`
            raise _bad("response_format.json_schema.schema is required: the JSON schema the answer must match "
                       "(use {'type': 'json_object'} for any JSON object)", "response_format.json_schema.schema",
                       "missing_required_parameter")
        # OpenAI's strict=false lets the model stray from the schema; here the
        # schema is always enforced (as vLLM does), which satisfies both.
        return guidance.json_schema(spec["schema"])
    raise _bad(f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
               "response_format")


def _guided(body: _SamplingFields) -> tuple[str, str] | None:
    """vLLM's guided_json / guided_regex / guided_choice, as (param, grammar)."""
    asked = [(name, getattr(body, name)) for name in ("guided_json", "guided_regex", "guided_choice")
             if getattr(body, name) is not None]
    if not asked:
        return None
    if len(asked) > 1:
        raise _bad(f"only one of guided_json, guided_regex, guided_choice may be set, got "
                   f"{', '.join(n for n, _ in asked)}", asked[1][0])
    name, value = asked[0]
    if name == "guided_json":
        build = guidance.json_schema_text if isinstance(value, str) else guidance.json_schema
        return name, _compiled(name, lambda: build(value))
    if name == "guided_regex":
        return name, guidance.regex(value)
    if not value or len(value) > MAX_CHOICES or not all(value):
        raise _bad(f"guided_choice takes 1 to {MAX_CHOICES} non-empty strings", name)
    return name, guidance.choice(value)


def request_grammar(body: _SamplingFields, compiler: GrammarCompiler,
                    tools: tool_calls.ToolPlan | None = None) -> str | None:
    """The one grammar this request's output must match, or None."""
    found: list[tuple[str, str]] = []
    if (grammar := _compiled("response_format", lambda: _response_format(body))) is not None:
        found.append(("response_format", grammar))
    if (guided := _guided(body)) is not None:
        found.append(guided)
    if tools is not None:
        param = "tool_choice" if tools.named else "tools"
        if (grammar := _compiled(param, tools.grammar)) is not None:
            found.append((param, grammar))
    if len(found) > 1:
        raise _bad(f"{found[0][0]} and {found[1][0]} both constrain the output; ask for one",
                   found[1][0])
    if not found:
        return None
    param, grammar = found[0]
    return compiler.check(grammar, param)


def _compiled(param: str, build):
    """build(), with the library's refusal of the schema itself as a 400 naming param."""
    try:
        return build()
    except guidance.GrammarError as e:
        raise _bad(f"{param}: the grammar library cannot compile it: {e}", param, "invalid_schema") from None
