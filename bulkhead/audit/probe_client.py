"""The probe's view of an OpenAI-compatible endpoint: keys, discovery, completions.

Every call returns a `Reply` rather than raising for HTTP errors: the probe's
checks are about status codes (an over-length prompt must get a 4xx), so a
non-2xx answer is data. Only a dead endpoint raises (`EngineUnreachable`).
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bulkhead.audit.errors import AuditError, EngineResponseError, EngineUnreachable
from bulkhead.audit.http_client import get_or_unreachable


class ProbeInputError(AuditError):
    """The keys file or a `probe` flag cannot be used as given."""


def load_keys(path: str | Path) -> dict[str, str]:
    """`[keys]` table of `"api-key" = "tenant"`, as `bulkhead serve --api-keys` reads it."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ProbeInputError(f"keys file {path}: {error.strerror or error}") from error
    except tomllib.TOMLDecodeError as error:
        raise ProbeInputError(f"keys file {path}: not TOML ({error})") from error
    keys = data.get("keys")
    if not isinstance(keys, dict) or not keys:
        raise ProbeInputError(f'keys file {path}: needs a non-empty [keys] table of "api-key" = "tenant"')
    for key, tenant in keys.items():
        if not isinstance(tenant, str) or not tenant:
            raise ProbeInputError(f"keys file {path}: tenant of a key must be a non-empty string")
    return dict(keys)


@dataclass(frozen=True)
class Reply:
    status: int  # HTTP status; 0 when the request never got an answer
    text: str = ""  # the completion text (choices[0].text or message.content)
    tokens: tuple[str, ...] | None = None  # logprobs.tokens when the server returned them
    prompt_tokens: int | None = None  # usage.prompt_tokens
    total_tokens: int | None = None  # usage.total_tokens
    finish_reason: str | None = None  # choices[0].finish_reason
    error_code: str | None = None  # error.code of an OpenAI-shaped error body
    transport_error: str | None = None
    tool_arguments: tuple[str, ...] = ()  # chat: each tool call's arguments (JSON text)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def failure(self) -> str:
        """What went wrong, for a finding: the transport error, or the status and error code."""
        code = f" ({self.error_code})" if self.error_code else ""
        return self.transport_error or f"HTTP {self.status}{code}"


@dataclass(frozen=True)
class RawReply:
    status: int  # 0 when the request never got an answer
    body: str  # the response body, or the transport error


def _error_code(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = error.get("code")
        return str(code) if code is not None else error.get("type")
    return None


def _choice_text(choice: dict[str, Any]) -> str:
    if isinstance(choice.get("text"), str):
        return choice["text"]
    message = choice.get("message") or choice.get("delta") or {}
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else ""


class ProbeClient:
    """One endpoint, one httpx client shared by the probe's threads."""

    def __init__(self, base_url: str, client: httpx.Client) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")  # http://host:port, with or without /v1
        self._client = client

    @staticmethod
    def _auth(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def get_json(self, path: str, key: str) -> dict[str, Any] | None:
        """GET a JSON object; None when the endpoint is missing or not JSON. Raises if unreachable."""
        response = get_or_unreachable(self._client, self.base_url, path, headers=self._auth(key))
        if response.status_code in (401, 403):
            raise EngineUnreachable(self.base_url, f"{path} answered {response.status_code}: the key was refused")
        if response.status_code >= 400:
            return None
        try:
            body = response.json()
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    def discover(self, key: str, model: str | None) -> tuple[str, int | None, str]:
        """(model id, advertised context length or None, where the length came from)."""
        models = self.get_json("/v1/models", key)
        entries = [m for m in (models or {}).get("data") or [] if isinstance(m, dict) and m.get("id")]
        if model is None:
            if not entries:
                raise EngineResponseError(self.base_url, "GET /v1/models lists no model; pass --model")
            model = str(entries[0]["id"])
        for entry in entries:
            if entry.get("id") == model and isinstance(entry.get("max_model_len"), int):
                return model, entry["max_model_len"], "/v1/models max_model_len"
        for path in ("/server_info", "/get_server_info"):
            info = self.get_json(path, key)
            if info and isinstance(info.get("context_length"), int):
                return model, info["context_length"], f"{path} context_length"
        return model, None, "not advertised"

    def post(self, key: str, path: str, body: dict[str, Any]) -> RawReply:
        """The status and body as they came (checks that compare two answers whole)."""
        try:
            response = self._client.post(self.base_url + path, json=body, headers=self._auth(key))
        except httpx.HTTPError as error:
            return RawReply(0, f"{type(error).__name__}: {error}")
        return RawReply(response.status_code, response.text)

    def complete(self, key: str, body: dict[str, Any], path: str = "/v1/completions") -> Reply:
        try:
            response = self._client.post(self.base_url + path, json=body, headers=self._auth(key))
        except httpx.HTTPError as error:
            return Reply(0, transport_error=f"{type(error).__name__}: {error}")
        if not 200 <= response.status_code < 300:
            return Reply(response.status_code, error_code=_error_code(response))
        try:
            data = response.json()
            choice = data["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            return Reply(response.status_code, error_code="malformed_response")
        logprobs = choice.get("logprobs")
        tokens = logprobs.get("tokens") if isinstance(logprobs, dict) else None
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        calls = message.get("tool_calls") if isinstance(message.get("tool_calls"), list) else []
        arguments = tuple(str((c.get("function") or {}).get("arguments", "")) for c in calls if isinstance(c, dict))
        return Reply(
            response.status_code,
            text=_choice_text(choice) + "".join(arguments),
            tool_arguments=arguments,
            tokens=tuple(tokens) if isinstance(tokens, list) else None,
            prompt_tokens=usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None,
            total_tokens=usage.get("total_tokens") if isinstance(usage.get("total_tokens"), int) else None,
            finish_reason=choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None,
        )

    def stream_first_chunk(self, key: str, body: dict[str, Any]) -> Reply:
        """Open a stream, read until the first data chunk, and close the connection (an abort)."""
        try:
            with self._client.stream(
                "POST", self.base_url + "/v1/completions", json={**body, "stream": True}, headers=self._auth(key)
            ) as response:
                if not 200 <= response.status_code < 300:
                    response.read()
                    return Reply(response.status_code, error_code=_error_code(response))
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[len("data:"):].strip()
                    if payload == "[DONE]":
                        break
                    try:
                        chunk = json.loads(payload)
                    except ValueError:
                        continue
                    if isinstance(chunk, dict) and "error" in chunk:
                        return Reply(500, error_code=str((chunk["error"] or {}).get("code")))
                    choices = chunk.get("choices") if isinstance(chunk, dict) else None
                    text = _choice_text(choices[0]) if choices else ""
                    return Reply(response.status_code, text=text)  # leaving the block closes the stream
                return Reply(response.status_code)
        except httpx.HTTPError as error:
            return Reply(0, transport_error=f"{type(error).__name__}: {error}")
