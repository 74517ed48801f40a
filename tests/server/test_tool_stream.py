"""A streamed answer with tools is held until whole, then sent as content
or as OpenAI's tool_calls deltas with finish_reason "tool_calls"."""
import json

from bulkhead.engine.outputs import RequestOutput
from bulkhead.server.tools import HeldChoice
from bulkhead.server.tools import tool_plan

PLAN = tool_plan([{"type": "function", "function": {"name": "f"}}], "auto", None)


def _out(text, finished=False, reason=None):
    return RequestOutput("r", (1,), text, (), finished, reason, 3, 1)


def _feed(pieces, reason="stop"):
    held = HeldChoice()
    chunks = []
    for k, piece in enumerate(pieces):
        last = k == len(pieces) - 1
        chunks += held.take(_out(piece, last, reason if last else None), 2, PLAN, lambda items: None)
    return chunks


def test_nothing_is_sent_before_the_answer_ends_then_calls_become_deltas():
    held = HeldChoice()
    assert held.take(_out("<tool_call>\n{\"name\": \"f\", "), 0, PLAN, lambda items: None) == []
    chunks = _feed(['Sure. <tool_call>\n{"name": "f", ', '"arguments": {"x": 1}}\n</tool_call>'])
    assert chunks[0]["delta"] == {"content": "Sure."}
    call = chunks[1]["delta"]["tool_calls"][0]
    assert call["index"] == 0 and call["function"]["name"] == "f" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {"x": 1}
    assert chunks[-1] == {"index": 2, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}


def test_a_plain_answer_arrives_whole_with_its_own_finish_reason():
    chunks = _feed(["Paris ", "is sunny."], reason="length")
    assert chunks == [{"index": 2, "delta": {"content": "Paris is sunny."}, "logprobs": None,
                       "finish_reason": "length"}]
