"""\\d, \\w and \\s mean ASCII, as Outlines and vLLM users expect (issue 34
item 3: `\\d{3}-\\d{3}-\\d{4}` answered '🯸🯸🯸-🯸🯸🯸-'): the translation
(model/regex_ascii.py), and through the real matcher only ASCII digits,
spaces and letters are allowed where a regex, a schema's `pattern` or a tool
schema asks for \\d, \\s or \\w. (llguidance already reads \\d and \\w in a
schema's pattern as ASCII, ECMAScript's meaning; those cases pin that down.)"""
import re

import pytest
import torch

from bulkhead.engine.grammar_mask import GrammarMasks
from bulkhead.engine.request import Request, SamplingParams
from bulkhead.model import guidance
from bulkhead.model.regex_ascii import ascii_regex, ascii_schema
from bulkhead.model.tokenizer import Tokenizer

V = 49152
EOS = 2


@pytest.mark.parametrize("pattern, translated", [
    (r"\d{3}-\d{4}", "[0-9]{3}-[0-9]{4}"),
    (r"\w+\s\S\W\D", r"[0-9A-Za-z_]+[\t\n\v\f\r ][^\t\n\v\f\r ][^0-9A-Za-z_][^0-9]"),
    (r"[\d-]+", "[0-9-]+"),  # inside a class: the set's members, not a nested class
    (r"[^\d\s]", r"[^0-9\t\n\v\f\r ]"),
    (r"[a\D]", "[a[^0-9]]"),  # a negation inside a class: a nested class
    (r"\\d", r"\\d"),  # an escaped backslash, then a literal d
    (r"\\\d", r"\\[0-9]"),
    (r"\.\[\d\]", r"\.\[[0-9]\]"),  # escaped brackets open no class
    (r"[]\d]", "[]0-9]"),  # a ] first in a class is a literal
    (r"[[:alpha:]\d]", "[[:alpha:]0-9]"),
    (r"\p{Greek}\x{41}\b", r"\p{Greek}\x{41}\b"),  # other escapes pass through
    ("plain", "plain"),
])
def test_shorthand_classes_become_ascii_sets(pattern, translated):
    assert ascii_regex(pattern) == translated


@pytest.mark.parametrize("pattern", [r"\d{3}-\d{3}", r"[\d-]+", r"\w+\s\W", r"[^\d\s]x", r"\\d\D"])
def test_translated_patterns_match_what_python_re_ascii_matches(pattern):
    ours = ascii_regex(pattern)  # (Python's re has no nested classes: [a\D] is checked by the matcher below)
    for text in ("123-456", "١٢٣-٤٥٦", "🯸🯸🯸-🯸🯸🯸", "a_b\u00a0é", "ab c!", "\\da", "\\d٣"):
        assert bool(re.fullmatch(ours, text)) == bool(re.fullmatch(pattern, text, re.ASCII)), (pattern, text)


def test_only_schema_patterns_are_translated_never_data_or_property_names():
    schema = {"type": "object",
              "properties": {"pattern": {"type": "string", "pattern": r"^\d+$"},
                             "list": {"type": "array", "items": {"pattern": r"\w"}}},
              "patternProperties": {r"^x\d$": {"type": "string"}},
              "anyOf": [{"pattern": r"\s"}], "$defs": {"a": {"not": {"pattern": r"\D"}}},
              "const": r"\d", "enum": [r"\d"], "default": {"pattern": r"\d"}}
    out = ascii_schema(schema)
    assert out["properties"]["pattern"] == {"type": "string", "pattern": "^[0-9]+$"}
    assert out["properties"]["list"]["items"]["pattern"] == "[0-9A-Za-z_]"
    assert list(out["patternProperties"]) == ["^x[0-9]$"]
    assert out["anyOf"][0]["pattern"] == r"[\t\n\v\f\r ]" and out["$defs"]["a"]["not"]["pattern"] == "[^0-9]"
    assert out["const"] == r"\d" and out["enum"] == [r"\d"] and out["default"] == {"pattern": r"\d"}
    assert schema["properties"]["pattern"]["pattern"] == r"^\d+$"  # the caller's schema is not changed


@pytest.fixture(scope="module")
def masks(smollm2_dir):
    return GrammarMasks(Tokenizer(smollm2_dir).to_json(), V, (EOS,))


def _allowed_texts(masks, tok, grammar, output: str) -> set[str]:
    """The texts of the tokens the grammar allows next, once the answer so far is `output`."""
    req = Request("r", "alpha", [1], SamplingParams(max_tokens=8, grammar=grammar), arrival=0)
    req.output_token_ids.extend(tok.encode(output))
    masked = masks.masked([req], torch.zeros(1, V))
    masks.forget("r")
    return {tok.decode([t]) for t in torch.nonzero(masked[0] == 0).flatten().tolist()}


@pytest.mark.parametrize("grammar, output", [
    (guidance.regex(r"\d{3}-\d{4}"), "12"),
    (guidance.regex(r"[\d-]+"), ""),
    (guidance.json_schema({"type": "string", "pattern": r"^\d{3}$"}), '"'),  # a JSON string opens with "
    (guidance.json_schema({"type": "object", "properties": {"pattern": {"type": "string", "pattern": r"^\d+$"}},
                           "required": ["pattern"]}), '{"pattern":"'),
], ids=["guided_regex", "in_class", "schema_pattern", "nested_schema_pattern"])
def test_the_real_matcher_allows_only_ascii_digits_for_backslash_d(masks, smollm2_dir, grammar, output):
    tok = Tokenizer(smollm2_dir)
    texts = _allowed_texts(masks, tok, grammar, output)
    assert "5" in texts
    digits = {t for t in texts if t and set(t) <= set("0123456789-")}  # bytes of a Unicode digit decode as \ufffd
    assert texts - digits <= {"", '"', '"}'}, sorted(texts - digits)[:20]


def _tool_grammar(pattern: str) -> str:
    from bulkhead.server.tools import tool_plan

    parameters = {"type": "object", "properties": {"x": {"type": "string", "pattern": pattern}}, "required": ["x"]}
    return tool_plan([{"type": "function", "function": {"name": "f", "parameters": parameters}}],
                     "required", None).grammar()


@pytest.mark.parametrize("grammar, output", [
    (guidance.regex(r"a\sb"), "a"),
    (guidance.regex(r"a\w"), "a"),
    (guidance.json_schema({"type": "string", "pattern": r"^a\sb$"}), '"a'),  # llguidance's own \s is Unicode
    (_tool_grammar(r"^a\sb$"), '<tool_call>\n{"name":"f","arguments":{"x":"a'),
], ids=["regex_s", "regex_w", "schema_s", "tool_schema_s"])
def test_the_real_matcher_allows_no_unicode_space_or_letter(masks, smollm2_dir, grammar, output):
    tok = Tokenizer(smollm2_dir)
    texts = _allowed_texts(masks, tok, grammar, output)
    assert texts and all(t.isascii() for t in texts), sorted(t for t in texts if not t.isascii())[:20]
