"""Tenants by API key, and the tenant table.

Keys come from a TOML file (`[keys]` table: key = tenant) or from the
environment (BULKHEAD_API_KEYS="key1=tenant1,key2=tenant2"). The same file
may hold a `[tenants.NAME]` table of weights and limits (bulkhead.server.tenants).
The file is re-read when it changes, so removing a key revokes it without a
restart. A file with a mistake is refused at start-up; on a reload the last
good keys and table stay, and the error is logged and shown in /server_info.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
import tomllib
from pathlib import Path

from bulkhead.errors import AuthenticationFailed
from bulkhead.server.tenants import DEFAULT_POLICY, TenantPolicy, TenantTableError, parse_tenant_table

log = logging.getLogger(__name__)

DEFAULT_TENANT = "default"
ENV_VAR = "BULKHEAD_API_KEYS"


class KeyStore:
    def __init__(self, path: Path | None = None, env_value: str | None = None):
        self.path = Path(path) if path else None
        self._env_keys = _parse_env(env_value) if env_value else {}
        self._file_keys: dict[str, str] = {}
        self._policies: dict[str, TenantPolicy] = {}
        self._mtime = None
        self._checked = 0.0
        self.reload_error: str | None = None  # the last reload's mistake, while the last good file serves
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
        text = self.path.read_text()
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise TenantTableError(f"{self.path}: not valid TOML: {e}") from None
        keys = data.get("keys", {})
        if not isinstance(keys, dict) or not all(isinstance(v, str) for v in keys.values()):
            raise TenantTableError(f"{self.path}: expected a [keys] table of key = \"tenant\"")
        known = set(keys.values()) | set(self._env_keys.values())
        policies = parse_tenant_table(data.get("tenants"), known, str(self.path), text)
        self._file_keys, self._policies, self._mtime = dict(keys), policies, mtime
        self.reload_error = None

    def maybe_reload(self) -> None:
        """Re-read the file if it changed (at most once a second). A file with
        a mistake keeps the last good keys and table: it is logged and kept
        in reload_error, never raised to a request."""
        now = time.monotonic()
        if now - self._checked <= 1.0:
            return
        self._checked = now
        try:
            self._reload()
        except (OSError, ValueError) as e:
            if str(e) != self.reload_error:
                log.error("keys file not reloaded, the last good one stays in force: %s", e)
            self.reload_error = str(e)

    def policy(self, tenant: str) -> TenantPolicy:
        return self._policies.get(tenant, DEFAULT_POLICY)

    @property
    def policies(self) -> dict[str, TenantPolicy]:
        return dict(self._policies)

    @property
    def tenants(self) -> set[str]:
        return set(self._env_keys.values()) | set(self._file_keys.values())

    def tenant_for(self, authorization: str | None) -> str:
        self.maybe_reload()
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
