"""Tenants by API key.

Keys come from a TOML file (`[keys]` table: key = tenant) or from the
environment (BULKHEAD_API_KEYS="key1=tenant1,key2=tenant2"). The file is
re-read when it changes, so removing a key revokes it without a restart.
"""

from __future__ import annotations

import hmac
import os
import time
import tomllib
from pathlib import Path

from bulkhead.errors import AuthenticationFailed

DEFAULT_TENANT = "default"
ENV_VAR = "BULKHEAD_API_KEYS"


class KeyStore:
    def __init__(self, path: Path | None = None, env_value: str | None = None):
        self.path = Path(path) if path else None
        self._env_keys = _parse_env(env_value) if env_value else {}
        self._file_keys: dict[str, str] = {}
        self._mtime = None
        self._checked = 0.0
        self._reload()

    @classmethod
    def from_sources(cls, path: Path | None) -> KeyStore | None:
        env = os.environ.get(ENV_VAR)
        if path is None and not env:
            return None
        return cls(path, env)

    def _reload(self) -> None:
        if self.path is None:
            return
        mtime = self.path.stat().st_mtime_ns
        if mtime == self._mtime:
            return
        data = tomllib.loads(self.path.read_text())
        keys = data.get("keys", {})
        if not isinstance(keys, dict) or not all(isinstance(v, str) for v in keys.values()):
            raise ValueError(f"{self.path}: expected a [keys] table of key = \"tenant\"")
        self._file_keys, self._mtime = dict(keys), mtime

    @property
    def tenants(self) -> set[str]:
        return set(self._env_keys.values()) | set(self._file_keys.values())

    def tenant_for(self, authorization: str | None) -> str:
        now = time.monotonic()
        if now - self._checked > 1.0:  # stat the file at most once a second
            self._checked = now
            self._reload()
        if not authorization or not authorization.lower().startswith("bearer "):
            raise AuthenticationFailed("missing API key: send 'Authorization: Bearer <key>'")
        key = authorization[7:].strip()
        for known, tenant in (*self._file_keys.items(), *self._env_keys.items()):
            if hmac.compare_digest(known.encode(), key.encode()):
                return tenant
        raise AuthenticationFailed("invalid API key")


def _parse_env(value: str) -> dict[str, str]:
    keys = {}
    for item in value.split(","):
        if item.strip():
            key, sep, tenant = item.strip().partition("=")
            if not sep or not key or not tenant:
                raise ValueError(f"{ENV_VAR}: expected key=tenant pairs, got {item!r}")
            keys[key] = tenant
    return keys
