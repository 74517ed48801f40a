"""Structured outputs and tool calls through the official openai client, the
same cases against each deployment (tests/server: colocated; tests/disagg:
router + prefill + decode, where the grammar crosses the handoff)."""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel, Field

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"timezone": {"type": "string", "maxLength": 20}}, "required": ["timezone"], "additionalProperties": False}}}


class Capital(BaseModel):
    country: str = Field(max_length=20)
    capital: str = Field(max_length=20)
    population_millions: int


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def parse_with_a_pydantic_model(client) -> None:
    r = client.chat.completions.parse(model=MODEL, messages=_user("What is the capital of France?"),
                                      response_format=Capital, max_tokens=120, temperature=0.7, seed=3, n=2)
    assert len(r.choices) == 2
    for c in r.choices:
        assert c.finish_reason == "stop", c.message.content
        assert isinstance(c.message.parsed, Capital)


def json_object_streamed_with_n(client) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=_user("Describe a cat in JSON."), n=3,
                                            response_format={"type": "json_object"}, max_tokens=150,
                                            temperature=1.0, seed=11, stream=True)
    texts, finish = {}, {}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            finish[c.index] = c.finish_reason or finish.get(c.index)
    assert sorted(texts) == [0, 1, 2]
    for i, text in texts.items():
        if finish[i] == "stop":
            assert isinstance(json.loads(text), dict)
    assert "stop" in finish.values()


def guided_choice_and_regex(client) -> None:
    r = client.chat.completions.create(model=MODEL, messages=_user("Is the sky green?"), max_tokens=5,
                                       temperature=1.0, seed=1, n=4, extra_body={"guided_choice": ["yes", "no"]})
    assert {c.message.content for c in r.choices} <= {"yes", "no"}
    r = client.completions.create(model=MODEL, prompt="The year the war ended:", max_tokens=8, temperature=0,
                                  extra_body={"guided_regex": "[12][0-9]{3}"})
    assert len(r.choices[0].text) == 4 and r.choices[0].text.isdigit()


def an_uncompilable_schema_is_a_400(client) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=_user("hi"), max_tokens=5, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}})
    err = e.value.body
    assert err["param"] == "response_format" and "frobnicate" in err["message"]


def _check_weather_call(call) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert set(args) >= {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")
    return args


def required_tool_call(client) -> None:
    r = client.chat.completions.create(model=MODEL, messages=_user("What's the weather in Paris?"), max_tokens=80,
                                       temperature=0, tools=[WEATHER, TIME], tool_choice="required",
                                       parallel_tool_calls=False)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert len(c.message.tool_calls) == 1
    assert c.message.tool_calls[0].function.name in ("get_weather", "get_time")
    json.loads(c.message.tool_calls[0].function.arguments)


def named_tool_call_streamed(client) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=_user("Weather in Rome please"), max_tokens=80, temperature=0.8, seed=2, n=2,
        tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True)
    calls, finish = {}, {}
    for chunk in stream:
        for c in chunk.choices:
            finish[c.index] = c.finish_reason or finish.get(c.index)
            for d in c.delta.tool_calls or ():
                slot = calls.setdefault((c.index, d.index), {"id": None, "name": "", "arguments": ""})
                slot["id"] = d.id or slot["id"]
                slot["name"] += d.function.name or ""
                slot["arguments"] += d.function.arguments or ""
    assert finish == {0: "tool_calls", 1: "tool_calls"}, (finish, calls)
    assert sorted(calls) == [(0, 0), (1, 0)]
    for slot in calls.values():
        assert slot["name"] == "get_weather" and slot["id"].startswith("call_")
        json.loads(slot["arguments"])


def tool_result_fed_back(client) -> None:
    first = client.chat.completions.create(model=MODEL, messages=_user("What's the weather in Paris?"),
                                           max_tokens=80, temperature=0, tools=[WEATHER],
                                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = first.choices[0].message.tool_calls[0]
    _check_weather_call(call)
    messages = _user("What's the weather in Paris?") + [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees celsius."},
    ]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, temperature=0, tools=[WEATHER],
                                       tool_choice="none")
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    alone = client.chat.completions.create(model=MODEL, messages=_user("What's the weather in Paris?"), max_tokens=1,
                                           temperature=0, tools=[WEATHER], tool_choice="none")
    assert r.usage.prompt_tokens > alone.usage.prompt_tokens + 20  # the call and its result reached the prompt


ALL = [parse_with_a_pydantic_model, json_object_streamed_with_n, guided_choice_and_regex,
       an_uncompilable_schema_is_a_400, required_tool_call, named_tool_call_streamed, tool_result_fed_back]
