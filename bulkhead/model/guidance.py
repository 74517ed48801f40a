"""Grammars for structured outputs, compiled and checked by llguidance.

Torch-free: the HTTP layer compiles and validates a request's grammar here
(a schema the library cannot compile is a 400 before anything is admitted),
and the engine builds its matchers from the same text. A grammar is
llguidance's own JSON text, so it crosses the prefill -> decode boundary as
a plain string inside the signed ticket's sampling parameters.
"""

from __future__ import annotations

import functools
import json

from llguidance import LLMatcher, LLParserLimits, LLTokenizer

from bulkhead.model.regex_ascii import ascii_regex, ascii_schema

# Compact JSON (no free whitespace between tokens): a small model that may
# put whitespace anywhere can spend its whole max_tokens on newlines, and no
# JSON reader needs the whitespace. A schema's own "x-guidance" overrides it.
JSON_OPTIONS = {"whitespace_flexible": False}


def limits() -> LLParserLimits:
    # Errors name the problem without echoing parser state (which holds the
    # request's own tokens) into logs and responses.
    return LLParserLimits(verbose_errors=False)


class GrammarError(ValueError):
    """The grammar library refused a request's schema, regex or choices."""


def json_schema(schema: dict | bool) -> str:
    if schema is True:  # JSON Schema's "anything"
        schema = {}
    if not isinstance(schema, dict):
        raise GrammarError(f"a JSON schema is an object (or true), got {json.dumps(schema)[:40]}")
    try:
        return LLMatcher.grammar_from_json_schema(json.dumps(ascii_schema(schema)), defaults=JSON_OPTIONS)
    except ValueError as e:
        raise GrammarError(str(e)) from None


def regex(pattern: str) -> str:
    return LLMatcher.grammar_from_regex(ascii_regex(pattern))


def choice(options: list[str]) -> str:
    # Lark string literals take JSON's quoting, so any choice text is exact.
    return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(o) for o in options))


def schema_for_lark(schema: dict) -> dict:
    """A schema to embed in a lark grammar's %json, with json_schema's meaning of \\d, \\w and \\s."""
    return ascii_schema(schema)


def lark(text: str) -> str:
    return LLMatcher.grammar_from_lark(text)


@functools.lru_cache(maxsize=4)
def _tokenizer(tokenizer_json: str, vocab_size: int, eos_token_ids: tuple[int, ...]) -> LLTokenizer:
    # ~0.4 s for a 49k vocabulary: built once per process and model.
    return LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids) or None)


def tokenizer(tokenizer_json: str, vocab_size: int, eos_token_ids: tuple[int, ...]) -> LLTokenizer:
    return _tokenizer(tokenizer_json, vocab_size, tuple(eos_token_ids))


def check(grammar: str, tok: LLTokenizer | None) -> None:
    """Raise GrammarError naming the problem if llguidance cannot build it."""
    message = LLMatcher.validate_grammar(grammar, tok, limits=limits())
    if message and not message.startswith("WARNING"):
        raise GrammarError(message.strip())


def matcher(grammar: str, tok: LLTokenizer) -> LLMatcher:
    return LLMatcher(tok, grammar, log_level=0, limits=limits())


def json_schema_text(text: str) -> str:
    """A schema the client sent as a JSON string (vLLM's guided_json allows both)."""
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise GrammarError(f"not JSON: {e}") from None
    return json_schema(schema)
