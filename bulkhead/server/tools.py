"""Tool calling: which tools a request offers, the grammar that forces a
call, the prompt that shows the tools, and the calls found in an answer.

One format throughout, Hermes's (Qwen2.5's, and NousResearch's):
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`. A chat
template that knows tools gets them as `tools=`; one that does not (the
bundled SmolLM2's) gets them in a system message in this format. With
tool_choice "required" or a named function the grammar admits nothing but
such calls to the offered functions, with arguments matching their schemas,
so even a 135M model returns a valid call; with "auto" the model may answer
in text or in calls, and the answer is parsed.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from bulkhead.errors import InvalidRequest
from bulkhead.model import guidance

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function name
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def _bad(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="invalid_value")


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def to_dict(self, index: int | None = None) -> dict:
        d = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return d if index is None else {"index": index, **d}


@dataclass(frozen=True)
class ToolPlan:
    functions: tuple[dict, ...]  # each {"name", "description"?, "parameters"}
    choice: str  # "auto", "required" or "named"
    named: str | None = None
    parallel: bool = True

    def grammar(self) -> str | None:
        """Forces calls for "required" and a named function; None for "auto"."""
        if self.choice == "auto":
            return None
        offered = [f for f in self.functions if self.named in (None, f["name"])]
        one = {"anyOf": [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                             "arguments": f["parameters"]},
                          "required": ["name", "arguments"], "additionalProperties": False} for f in offered],
               "x-guidance": guidance.JSON_OPTIONS}
        call = f'"{OPEN}\\n" %json {json.dumps(guidance.schema_for_lark(one))} "\\n{CLOSE}"'
        repeat = ' ("\\n" call)*' if self.parallel and self.named is None else ""
        return guidance.lark(f"start: call{repeat}\ncall: {call}\n")

    def system_prompt(self) -> str:
        listed = "\n".join(json.dumps({"type": "function", "function": f}) for f in self.functions)
        return ("You may call one or more functions to assist with the user query.\n"
                f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n"
                "</tools>\nFor each function call, return a json object with function name and arguments within "
                f"{OPEN}{CLOSE} XML tags:\n{OPEN}\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n' + CLOSE)

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls). Text without a well-formed call to an offered function stays content."""
        names = {f["name"] for f in self.functions}
        calls = []
        for body in _CALL.findall(text):
            try:
                call = json.loads(body)
            except json.JSONDecodeError:
                return text, []
            if not isinstance(call, dict) or call.get("name") not in names:
                return text, []
            args = call.get("arguments", call.get("parameters", {}))
            calls.append(ToolCall("call_" + uuid.uuid4().hex[:24], call["name"], json.dumps(args)))
        if not calls:
            return text, []
        content = text[: text.find(OPEN)].strip()
        return content or None, calls


def tool_plan(tools: list[dict] | None, tool_choice, parallel: bool | None) -> ToolPlan | None:
    """None when no tool may be called (no tools, or tool_choice "none")."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise _bad("tool_choice needs tools", "tool_choice")
        return None
    functions = tuple(_function(t, i) for i, t in enumerate(tools))
    if len({f["name"] for f in functions}) != len(functions):
        raise _bad("tools: two functions have the same name", "tools")
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return None
    named = None
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        named = fn.get("name") if isinstance(fn, dict) else None
        if named not in {f["name"] for f in functions}:
            raise _bad(f"tool_choice names {named!r}, which is not among the tools", "tool_choice")
        choice = "named"
    elif choice not in ("auto", "required"):
        raise _bad(f"tool_choice must be 'none', 'auto', 'required' or a function, got {choice!r}", "tool_choice")
    return ToolPlan(functions, choice, named, parallel is not False)


def _function(tool, index: int) -> dict:
    fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not _NAME.match(fn["name"]):
        raise _bad(f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ...}}}} with a name of "
                   "1-64 letters, digits, '_' or '-'", "tools")
    parameters = fn.get("parameters", EMPTY_PARAMETERS)
    if not isinstance(parameters, dict):
        raise _bad(f"tools[{index}].function.parameters must be a JSON schema object", "tools")
    out = {"name": fn["name"], "parameters": parameters}
    if fn.get("description"):
        out["description"] = fn["description"]
    return out


def template_messages(messages: list[dict], plan: ToolPlan | None, template_knows_tools: bool) -> list[dict]:
    """Messages for a template that does not know tools: the tools as a
    system message, earlier calls as Hermes text, tool results wrapped as
    Hermes's <tool_response>. A template that knows tools gets them as they are."""
    if template_knows_tools:
        return [_arguments_as_objects(m) for m in messages]
    out = []
    for m in messages:
        m = dict(m)
        calls = m.pop("tool_calls", None) or []
        if calls:
            text = "\n".join(f"{OPEN}\n" + json.dumps({"name": c["function"]["name"],
                                                        "arguments": _as_object(c["function"].get("arguments"))})
                             + f"\n{CLOSE}" for c in calls)
            m["content"] = ((m.get("content") or "") + "\n" + text).lstrip("\n")
        if m["role"] == "tool":
            m["content"] = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
        m.pop("tool_call_id", None)
        out.append(m)
    if plan is not None:
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + plan.system_prompt()}
        else:
            out.insert(0, {"role": "system", "content": plan.system_prompt()})
    return out


def _as_object(arguments):
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def _arguments_as_objects(m: dict) -> dict:
    # Templates that render calls expect arguments as a mapping (Hugging Face's convention).
    if not m.get("tool_calls"):
        return m
    calls = [{**c, "function": {**c["function"], "arguments": _as_object(c["function"].get("arguments"))}}
             for c in m["tool_calls"]]
    return {**m, "tool_calls": calls}


class HeldChoice:
    """One streamed chat choice that may turn out to be tool calls: its text
    and logprobs are held until it ends, then sent as content, or as
    OpenAI's tool_calls deltas (one per call, id and name with the whole
    arguments) with finish_reason "tool_calls"."""

    def __init__(self):
        self.text, self.logprobs = "", []

    def take(self, out, index: int, tools: ToolPlan, logprobs_of) -> list[dict]:
        self.text += out.text
        self.logprobs.extend(out.logprobs)
        if not out.finished:
            return []
        content, calls = tools.parse(self.text)
        lps = logprobs_of(self.logprobs)
        if not calls:
            delta = {"content": content} if content else {}
            return [{"index": index, "delta": delta, "logprobs": lps, "finish_reason": out.finish_reason}]
        chunks = [{"index": index, "delta": {"content": content}, "logprobs": None, "finish_reason": None}] \
            if content else []
        for k, call in enumerate(calls):
            chunks.append({"index": index, "delta": {"tool_calls": [call.to_dict(k)]}, "logprobs": None,
                           "finish_reason": None})
        chunks.append({"index": index, "delta": {}, "logprobs": lps, "finish_reason": "tool_calls"})
        return chunks
