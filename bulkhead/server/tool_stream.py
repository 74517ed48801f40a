"""Streaming an answer that may be tool calls."""

from __future__ import annotations

from bulkhead.server.tools import ToolPlan


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
        chunks = []
        if content:
            chunks.append({"index": index, "delta": {"content": content}, "logprobs": None, "finish_reason": None})
        for k, call in enumerate(calls):
            chunks.append({"index": index, "delta": {"tool_calls": [call.to_dict(k)]}, "logprobs": None,
                           "finish_reason": None})
        chunks.append({"index": index, "delta": {}, "logprobs": lps, "finish_reason": "tool_calls"})
        return chunks
