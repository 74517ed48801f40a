"""Read JSON and text from one engine's HTTP API, with typed errors.

Responses are memoised per path: dialect detection asks several dialects
about the same endpoints, and each engine is read once per run.
"""

from __future__ import annotations

from typing import Any

import httpx

from bulkhead.audit.errors import EngineResponseError, EngineUnreachable


class EndpointMissing(Exception):
    """The engine answered 404/405/501: this endpoint is not part of its dialect (or is turned off)."""


class EngineClient:
    def __init__(self, base_url: str, client: httpx.Client) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = client
        self._cache: dict[str, httpx.Response | EndpointMissing] = {}

    def _get(self, path: str) -> httpx.Response:
        if path not in self._cache:
            self._cache[path] = self._fetch(path)
        result = self._cache[path]
        if isinstance(result, EndpointMissing):
            raise result
        return result

    def _fetch(self, path: str) -> httpx.Response | EndpointMissing:
        response = get_or_unreachable(self._client, self.base_url, path)
        if response.status_code in (401, 403):
            raise EngineUnreachable(self.base_url, f"{path} answered {response.status_code}; pass --api-key "
                                   "(bulkhead with keys on: an operator key, keys.toml [operators])")
        if response.status_code in (404, 405, 501):  # 501: llama.cpp's answer for a disabled endpoint (/slots)
            return EndpointMissing(path)
        if response.status_code >= 400:
            raise EngineResponseError(self.base_url, f"{path} answered HTTP {response.status_code}")
        return response

    def try_json(self, path: str, kind: type = dict) -> Any:
        """A JSON value of `kind` (an object; llama.cpp's /slots: a list), or
        None when the endpoint is missing or answers something else."""
        try:
            body = self._get(path).json()
        except (EndpointMissing, ValueError):
            return None
        return body if isinstance(body, kind) else None

    def try_text(self, path: str) -> str | None:
        try:
            return self._get(path).text
        except EndpointMissing:
            return None


def get_or_unreachable(client: httpx.Client, base_url: str, path: str, **kwargs) -> httpx.Response:
    """GET base_url + path; a timeout or transport failure becomes EngineUnreachable.

    Paths are appended, not joined, so engines behind a path prefix work."""
    try:
        return client.get(base_url + path, **kwargs)
    except httpx.TimeoutException as error:
        raise EngineUnreachable(base_url, f"timed out reading {path}") from error
    except httpx.TransportError as error:
        raise EngineUnreachable(base_url, f"cannot connect ({type(error).__name__}: {error})") from error
