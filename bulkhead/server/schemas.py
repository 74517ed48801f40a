"""OpenAI request bodies (with vLLM's sampling extensions)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingFields(BaseModel):
    # Unknown fields are kept so that params.py can refuse them by name: a
    # field dropped in silence is a request answered differently from what its client asked.
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # Accepted and ignored: none of these can change the tokens a request gets.
    user: str | None = None  # an end-user id for the caller's records; the tenant is the API key
    store: bool | None = None  # opts in to stored completions; bulkhead stores none
    metadata: dict[str, str] | None = None  # tags for stored completions, which bulkhead does not keep
    service_tier: str | None = None  # one tier here; shares come from the tenant table
    # Served with chat tools (False: at most one call per answer); completions have no tools: ignored.
    parallel_tool_calls: bool | None = None
    # vLLM extensions (benchmarks use them)
    top_k: int | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    # Subdivides the tenant's prefix-cache space; never crosses tenants.
    cache_salt: str | None = None
    # vLLM's structured outputs (bulkhead/server/structured.py): at most one.
    guided_json: dict | bool | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default for completions
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str | dict = "{}"  # OpenAI sends JSON text; a mapping is taken too


class ToolCall(BaseModel):
    """An assistant's earlier call, as a client sends it back."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool result: which call it answers


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    response_format: dict | None = None
