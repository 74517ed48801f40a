"""`\\d`, `\\w` and `\\s` with their ASCII meaning, before llguidance sees a regex.

llguidance parses regexes with Rust's regex syntax, where `\\d` is any
Unicode decimal digit (`🯸`, `٣`, ...), `\\w` any Unicode letter or digit
and `\\s` any Unicode space. A client of Outlines or vLLM who writes
`\\d{3}` means `[0-9]{3}` (Python's `re.ASCII`, ECMAScript's `\\d`): a small
model handed the Unicode class spends its tokens on digits no parser of the
answer accepts. So each shorthand class becomes its ASCII set here, in
`guided_regex` and in every JSON-schema `pattern` (tool parameters
included); every other escape passes through unchanged.

Torch-free and pure.
"""

from __future__ import annotations

# Python's re.ASCII sets (\s: space, \t, \n, \v, \f, \r), written as the
# inside of a class; a negation is a nested class, which Rust's syntax allows.
_INSIDE = {"d": "0-9", "w": "0-9A-Za-z_", "s": r"\t\n\v\f\r "}
_SHORTHANDS = {**_INSIDE, **{k.upper(): "^" + v for k, v in _INSIDE.items()}}

# Schema keywords whose value is one sub-schema, a list of them, or a map of
# name -> sub-schema. Everything else (const, enum, default, examples, and
# the property *names* under "properties") is data and is left as it is.
_ONE = ("items", "additionalItems", "additionalProperties", "unevaluatedItems", "unevaluatedProperties",
        "contains", "propertyNames", "not", "if", "then", "else")
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAP = ("properties", "$defs", "definitions", "dependentSchemas")


def ascii_regex(pattern: str) -> str:
    """pattern with \\d \\w \\s \\D \\W \\S as ASCII classes, inside and outside [...]."""
    out: list[str] = []
    depth = 0  # how many [...] classes are open here
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            escaped = pattern[i + 1]
            out.append(_shorthand(escaped, depth > 0) if escaped in _SHORTHANDS else c + escaped)
            i += 2
            continue
        if c == "[":
            if depth and pattern.startswith("[:", i):  # [:alpha:] inside a class: copy it whole
                end = pattern.find(":]", i + 2)
                if end != -1:
                    out.append(pattern[i:end + 2])
                    i = end + 2
                    continue
            depth += 1
            out.append(c)
            i += 1
            opened = i
            if pattern.startswith("^", i):
                out.append("^")
                i += 1
            if pattern.startswith("]", i) and i <= opened + 1:  # `[]` / `[^]`: a literal ] first
                out.append("]")
                i += 1
            continue
        if c == "]" and depth:
            depth -= 1
        out.append(c)
        i += 1
    return "".join(out)


def _shorthand(letter: str, in_class: bool) -> str:
    ascii_set = _SHORTHANDS[letter]
    if in_class and not ascii_set.startswith("^"):
        return ascii_set  # [\d-] -> [0-9-]
    return f"[{ascii_set}]"  # \d -> [0-9]; [\D] -> [[^0-9]]


def ascii_schema(schema):
    """A copy of a JSON schema whose `pattern` and `patternProperties` regexes are ascii_regex'd."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "pattern" and isinstance(value, str):
            out[key] = ascii_regex(value)
        elif key == "patternProperties" and isinstance(value, dict):
            out[key] = {ascii_regex(k): ascii_schema(v) for k, v in value.items()}
        elif key in _MAP and isinstance(value, dict):
            out[key] = {k: ascii_schema(v) for k, v in value.items()}
        elif key in _LIST and isinstance(value, list):
            out[key] = [ascii_schema(v) for v in value]
        elif key in _ONE:
            out[key] = ascii_schema(value)
        else:
            out[key] = value
    return out
