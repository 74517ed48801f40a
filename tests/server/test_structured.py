"""What a request's output constraint becomes (server/structured.py,
server/tools.py): one grammar or none, a 400 naming the field for anything
the grammar library or the tool rules refuse, and tool calls read back
out of an answer in OpenAI's shape."""
import json

import pytest

from bulkhead.errors import InvalidRequest
from bulkhead.model.tokenizer import Tokenizer
from bulkhead.server.params import chat_messages
from bulkhead.server.schemas import ChatCompletionRequest, CompletionRequest
from bulkhead.server.structured import GrammarCompiler, request_grammar
from bulkhead.server.tools import tool_plan, template_messages

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


@pytest.fixture(scope="module")
def compiler(smollm2_dir):
    return GrammarCompiler(Tokenizer(smollm2_dir), lambda: 49152)


def chat(**kw):
    kw.setdefault("messages", [{"role": "user", "content": "hi"}])
    return ChatCompletionRequest(**kw)


def _refused(compiler, body, tools=None) -> dict:
    with pytest.raises(InvalidRequest) as e:
        request_grammar(body, compiler, tools)
    err = e.value.to_dict()["error"]
    assert err["type"] == "invalid_request_error" and e.value.status == 400
    return err


def test_text_and_nothing_need_no_grammar(compiler):
    assert request_grammar(chat(), compiler) is None
    assert request_grammar(chat(response_format={"type": "text"}), compiler) is None


@pytest.mark.parametrize("body", [
    chat(response_format={"type": "json_object"}),
    chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "strict": True,
                                                                 "schema": {"type": "object"}}}),
    chat(guided_json={"type": "array"}), chat(guided_json='{"type": "integer"}'), chat(guided_json=True),
    chat(guided_regex="[a-z]+"), chat(guided_choice=["yes", "no"]),
    CompletionRequest(prompt="hi", guided_choice=["a", "b"]),
])
def test_each_form_becomes_a_grammar(compiler, body):
    assert request_grammar(body, compiler)


def test_a_schema_the_library_cannot_compile_is_a_400_naming_the_problem(compiler):
    err = _refused(compiler, chat(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "frobnicate"}}}}}))
    assert err["param"] == "response_format" and err["code"] == "invalid_schema"
    assert "frobnicate" in err["message"]


def test_a_dangling_ref_is_named(compiler):
    err = _refused(compiler, chat(response_format={"type": "json_schema",
                                                   "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}}))
    assert "nowhere" in err["message"]


def test_a_bad_regex_is_named(compiler):
    err = _refused(compiler, chat(guided_regex="a("))
    assert err["param"] == "guided_regex" and "unclosed group" in err["message"]


@pytest.mark.parametrize("body,param", [
    (chat(response_format={"type": "yaml"}), "response_format"),
    (chat(response_format={"type": "json_schema"}), "response_format"),
    (chat(guided_json="{not json"), "guided_json"),
    (chat(guided_choice=[]), "guided_choice"),
    (chat(guided_choice=["a", ""]), "guided_choice"),
    (chat(guided_regex="a", guided_choice=["a"]), "guided_choice"),
    (chat(guided_regex="a", response_format={"type": "json_object"}), "guided_regex"),
])
def test_malformed_or_conflicting_constraints_are_refused_by_name(compiler, body, param):
    assert _refused(compiler, body)["param"] == param


@pytest.mark.parametrize("spec", [{"name": "x"}, {"name": "x", "strict": True}])
def test_a_json_schema_format_without_a_schema_is_a_400_naming_it(compiler, spec):
    # Issue 34 item 5: it was taken as "anything" and answered `null`; OpenAI answers 400.
    err = _refused(compiler, chat(response_format={"type": "json_schema", "json_schema": spec}))
    assert err["param"] == "response_format.json_schema.schema" and err["code"] == "missing_required_parameter"
    assert request_grammar(chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
                           compiler)  # an empty schema, asked for by name, still means any JSON value


def test_forced_tool_calls_and_response_format_conflict(compiler):
    plan = tool_plan([WEATHER], "required", None)
    assert _refused(compiler, chat(response_format={"type": "json_object"}), plan)["param"] == "tools"


def test_a_tool_schema_the_library_cannot_compile_is_named(compiler):
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "frobnicate"}}}
    err = _refused(compiler, chat(), tool_plan([bad], "required", None))
    assert err["param"] == "tools" and "frobnicate" in err["message"]


def test_tool_choice_forms():
    assert tool_plan(None, None, None) is None and tool_plan(None, "none", None) is None
    assert tool_plan([WEATHER], "none", None) is None
    assert tool_plan([WEATHER], None, None).choice == "auto"  # OpenAI's default with tools
    assert tool_plan([WEATHER], "required", None).grammar() is not None
    named = tool_plan([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}}, None)
    assert named.choice == "named" and named.named == "get_time"
    assert tool_plan([WEATHER], "auto", None).grammar() is None


@pytest.mark.parametrize("tools,choice,param", [
    (None, "auto", "tool_choice"), (None, "required", "tool_choice"),
    ([WEATHER], "sometimes", "tool_choice"),
    ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
    ([{"type": "function"}], "auto", "tools"),
    ([{"type": "function", "function": {"name": "has space"}}], "auto", "tools"),
    ([WEATHER, WEATHER], "auto", "tools"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], "auto", "tools"),
])
def test_bad_tools_are_refused_by_name(tools, choice, param):
    with pytest.raises(InvalidRequest) as e:
        tool_plan(tools, choice, None)
    assert e.value.param == param


def test_calls_are_parsed_in_openai_shape():
    plan = tool_plan([WEATHER, TIME], "auto", None)
    content, calls = plan.parse('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
                                '\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    assert content == "Let me check."
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    d = calls[0].to_dict(0)
    assert d["type"] == "function" and d["id"].startswith("call_") and d["index"] == 0


@pytest.mark.parametrize("text", ["Paris is sunny.", "<tool_call>\n{broken\n</tool_call>",
                                  '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>'])
def test_text_without_a_valid_call_stays_content(text):
    assert tool_plan([WEATHER], "auto", None).parse(text) == (text, [])


def test_a_template_without_tools_gets_them_in_a_system_message_and_calls_as_text():
    plan = tool_plan([WEATHER], "auto", None)
    body = chat(messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ])
    messages = template_messages(chat_messages(body), plan, template_knows_tools=False)
    assert messages[0]["role"] == "system" and "get_weather" in messages[0]["content"]
    assert '"arguments": {"city": "Paris"}' in messages[2]["content"] and "tool_calls" not in messages[2]
    assert messages[3] == {"role": "tool", "content": "<tool_response>\nsunny\n</tool_response>"}


def test_a_template_that_knows_tools_gets_calls_with_arguments_as_objects():
    body = chat(messages=[{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]}])
    messages = template_messages(chat_messages(body), None, template_knows_tools=True)
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == {"x": 1}


@pytest.mark.parametrize("body,param", [
    (chat(guided_json="5"), "guided_json"), (chat(guided_json={"type": 5}), "guided_json"),
    (chat(guided_json=False), "guided_json"),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": False}}),
     "response_format"),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"properties": 7}}}),
     "response_format"),
])
def test_a_schema_refused_before_compiling_is_a_400_not_a_500(compiler, body, param):
    err = _refused(compiler, body)
    assert err["param"] == param and err["code"] == "invalid_schema"


@pytest.mark.parametrize("choice", [{"type": "function", "function": "get_weather"}, {"type": "function"},
                                    {"function": {"name": "get_weather"}}])
def test_a_malformed_named_choice_is_a_400(choice):
    with pytest.raises(InvalidRequest) as e:
        tool_plan([WEATHER], choice, None)
    assert e.value.param == "tool_choice"


def test_an_earlier_call_must_name_its_function():
    from pydantic import ValidationError
    with pytest.raises(ValidationError):
        chat(messages=[{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {}}]}])
