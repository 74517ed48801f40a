"""Who is asking: API keys name tenants, operator keys open the operator endpoints.

Keys come from keys.toml (bulkhead.server.keys_file: `[keys]` key = tenant,
`[operators]` key = name, `[tenants.NAME]` limits) and from the environment
(BULKHEAD_API_KEYS="key1=tenant1,key2=tenant2", BULKHEAD_OPERATOR_KEYS="key=name").
The file is re-read when it changes, so removing a key revokes it without a
restart. A file with a mistake is refused at start-up. On a reload, a file
with a mistake, or no file at all (an editor replacing it), keeps the last
good keys and table in force: the error is logged once, shown in
/server_info and counted in /metrics, never raised to a request.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from pathlib import Path

from bulkhead.errors import AuthenticationFailed, PermissionDenied
from bulkhead.server.keys_file import parse_key_file
from bulkhead.server.tenants import DEFAULT_POLICY, TenantPolicy

log = logging.getLogger(__name__)

DEFAULT_TENANT = "default"
ENV_VAR = "BULKHEAD_API_KEYS"
OPERATOR_ENV_VAR = "BULKHEAD_OPERATOR_KEYS"
# How often a request may stat the file: revocation takes effect within this.
RELOAD_CHECK_S = 1.0


class KeyStore:
    def __init__(self, path: Path | None = None, env_value: str | None = None, operator_env_value: str | None = None):
        self.path = Path(path) if path else None
        self._env_keys = _parse_env(env_value, ENV_VAR) if env_value else {}
        self._env_operators = _parse_env(operator_env_value, OPERATOR_ENV_VAR) if operator_env_value else {}
        self._file_keys: dict[str, str] = {}
        self._file_operators: dict[str, str] = {}
        self._policies: dict[str, TenantPolicy] = {}
        self._mtime = None  # of the last good file
        self._checked = 0.0
        self.reload_error: str | None = None  # the last reload's mistake, while the last good file serves
        self.reload_failures = 0  # distinct mistakes met on reload (bulkhead_keys_reload_failures_total)
        self._reload()

    @classmethod
    def from_sources(cls, path: Path | None) -> KeyStore | None:
        env = os.environ.get(ENV_VAR)
        if path is None and not env:
            return None
        return cls(path, env, os.environ.get(OPERATOR_ENV_VAR))

    def _reload(self) -> None:
        if self.path is None:
            return
        mtime = self.path.stat().st_mtime_ns
        if mtime == self._mtime:
            self.reload_error = None  # the last good file is back (or never left)
            return
        parsed = parse_key_file(self.path.read_text(), str(self.path), self._env_keys)
        self._file_keys, self._file_operators, self._policies = parsed.keys, parsed.operators, parsed.policies
        if self._mtime is not None:
            log.info("keys file reloaded: %d keys, %d operator keys", len(parsed.keys), len(parsed.operators))
        self._mtime = mtime
        self.reload_error = None

    def maybe_reload(self) -> None:
        """Re-read the file if it changed (at most once a RELOAD_CHECK_S)."""
        now = time.monotonic()
        if now - self._checked <= RELOAD_CHECK_S:
            return
        self._checked = now
        try:
            self._reload()
        except (OSError, ValueError) as e:
            error = str(e) if not isinstance(e, OSError) else f"{self.path}: {e.strerror or e}"
            if error != self.reload_error:
                self.reload_failures += 1
                log.error("keys file not reloaded, the last good keys stay in force: %s", error)
            self.reload_error = error

    def policy(self, tenant: str) -> TenantPolicy:
        return self._policies.get(tenant, DEFAULT_POLICY)

    @property
    def policies(self) -> dict[str, TenantPolicy]:
        return dict(self._policies)

    @property
    def tenants(self) -> set[str]:
        return set(self._env_keys.values()) | set(self._file_keys.values())

    @property
    def operators(self) -> set[str]:
        return set(self._env_operators.values()) | set(self._file_operators.values())

    def _lookup(self, authorization: str | None) -> tuple[str | None, str | None]:
        """(tenant, operator) the bearer key names, at most one of them."""
        self.maybe_reload()
        if not authorization or not authorization.lower().startswith("bearer "):
            raise AuthenticationFailed("missing API key: send 'Authorization: Bearer <key>'")
        key = authorization[7:].strip().encode()
        tenant = operator = None
        # Compare with every key, whatever matched: the time taken says nothing about which one.
        for known, name in (*self._file_keys.items(), *self._env_keys.items()):
            if hmac.compare_digest(known.encode(), key):
                tenant = name
        for known, name in (*self._file_operators.items(), *self._env_operators.items()):
            if hmac.compare_digest(known.encode(), key):
                operator = name
        if tenant is None and operator is None:
            raise AuthenticationFailed("invalid API key")
        return tenant, operator

    def tenant_for(self, authorization: str | None) -> str:
        tenant, _ = self._lookup(authorization)
        if tenant is None:
            raise PermissionDenied("this is an operator key: it opens /metrics and /server_info; "
                                   "requests need a tenant's key")
        return tenant

    def operator_for(self, authorization: str | None) -> str:
        """The operator name, for /metrics and /server_info; a tenant's key gets a 403."""
        _, operator = self._lookup(authorization)
        if operator is None:
            raise PermissionDenied("this endpoint needs an operator key (keys.toml [operators]); "
                                   "a tenant's key does not open it")
        return operator


def _parse_env(value: str, var: str) -> dict[str, str]:
    keys = {}
    for item in value.split(","):
        if item.strip():
            key, sep, name = item.strip().partition("=")
            if not sep or not key or not name:
                raise ValueError(f"{var}: expected key=name pairs, got {item!r}")
            keys[key] = name
    return keys
