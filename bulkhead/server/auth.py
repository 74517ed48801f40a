"""Who is asking: API keys name tenants, operator keys open the operator endpoints.

Keys come from keys.toml (bulkhead.server.keys_file, which says how a
mistake in it fails closed) and from the environment
(BULKHEAD_API_KEYS="key1=tenant1,key2=tenant2", BULKHEAD_OPERATOR_KEYS="key=name").
The file is re-read when it changes, so removing a key revokes it without a
restart. While it cannot be read as a key file at all, the last good keys
serve and `stale` is set: the log, /metrics (bulkhead_keys_stale) and
/server_info say that revocations written in it are not in force. Errors
are logged once, never raised to a request.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from pathlib import Path

from bulkhead.errors import AuthenticationFailed, PermissionDenied
from bulkhead.server.keys_file import KeyFileUnreadable, parse_key_file
from bulkhead.server.tenants import DEFAULT_POLICY, TenantPolicy, TenantTableError

log = logging.getLogger(__name__)

DEFAULT_TENANT = "default"
ENV_VAR = "BULKHEAD_API_KEYS"
OPERATOR_ENV_VAR = "BULKHEAD_OPERATOR_KEYS"
# How often a request may stat the file: revocation takes effect within this.
RELOAD_CHECK_S = 1.0


class KeyStore:
    def __init__(self, path: Path | None = None, env_value: str | None = None, operator_env_value: str | None = None,
                 base_model_id: str | None = None):
        self.path = Path(path) if path else None
        self.base_model_id = base_model_id  # an adapter may not take its name
        self._env_keys = _parse_env(env_value, ENV_VAR) if env_value else {}
        self._env_operators = _parse_env(operator_env_value, OPERATOR_ENV_VAR) if operator_env_value else {}
        self._file_keys: dict[str, str] = {}
        self._file_operators: dict[str, str] = {}
        self._policies: dict[str, TenantPolicy] = {}
        self._adapters: dict[str, dict[str, Path]] = {}
        # Counts the key files applied: an adapter registry re-reads the adapter tables when it moves.
        self.generation = 0
        self._mtime = None  # of the last good file
        self._checked = 0.0
        self.reload_error: str | None = None  # the mistakes of the file on disk, if any
        self._problems: str | None = None  # those of the file in force
        # True while the file on disk cannot be read as a key file and the last good keys serve:
        # a key removed from it still works, which the operator must be told (log, /metrics, /server_info).
        self.stale = False
        self.reload_failures = 0  # distinct mistakes met on reload (bulkhead_keys_reload_failures_total)
        self._reload()

    @classmethod
    def from_sources(cls, path: Path | None, base_model_id: str | None = None) -> KeyStore | None:
        env = os.environ.get(ENV_VAR)
        if path is None and not env:
            return None
        return cls(path, env, os.environ.get(OPERATOR_ENV_VAR), base_model_id)

    def _reload(self) -> None:
        """Raises KeyFileUnreadable or OSError when the file cannot be read as
        a key file; applies everything else, closed (see the module doc)."""
        if self.path is None:
            return
        mtime = self.path.stat().st_mtime_ns
        if mtime == self._mtime:
            self.reload_error, self.stale = self._problems, False  # the file in force is back (or never left)
            return
        parsed = parse_key_file(self.path.read_text(), str(self.path), self._env_keys, self.base_model_id)
        if self._mtime is None and parsed.problems:
            raise TenantTableError(parsed.problems[0])  # at start-up every mistake is refused
        self._file_keys, self._file_operators = parsed.keys, parsed.operators
        if parsed.policies is not None:
            self._policies = parsed.policies
        self._adapters = parsed.adapters
        self.generation += 1
        self._problems = self._describe(parsed)
        if self._mtime is not None:
            log.info("keys file reloaded: %d keys, %d operator keys", len(parsed.keys), len(parsed.operators))
            if self._problems:
                self._count(self._problems, "keys file reloaded with mistakes, each failing closed: %s")
        self._mtime = mtime
        self.reload_error, self.stale = self._problems, False

    @staticmethod
    def _describe(parsed) -> str | None:
        if not parsed.problems:
            return None
        what = "; ".join(parsed.problems)
        if parsed.policies is None:
            return f"{what} (keys and operator keys applied; the last good tenant table stays in force)"
        return f"{what} (the entries named authorise nothing; the rest applied)"

    def _count(self, error: str, message: str) -> None:
        if error != self.reload_error:
            self.reload_failures += 1
            log.error(message, error)

    def maybe_reload(self) -> None:
        """Re-read the file if it changed (at most once a RELOAD_CHECK_S)."""
        now = time.monotonic()
        if now - self._checked <= RELOAD_CHECK_S:
            return
        self._checked = now
        try:
            self._reload()
        except (OSError, KeyFileUnreadable) as e:
            error = str(e) if not isinstance(e, OSError) else f"{self.path}: {e.strerror or e}"
            error += " -- REVOCATIONS IN THIS FILE ARE NOT IN FORCE: the last good keys still authorise"
            self._count(error, "keys file not reloaded: %s")
            self.reload_error, self.stale = error, True

    def policy(self, tenant: str) -> TenantPolicy:
        return self._policies.get(tenant, DEFAULT_POLICY)

    @property
    def policies(self) -> dict[str, TenantPolicy]:
        return dict(self._policies)

    @property
    def adapters(self) -> dict[str, dict[str, Path]]:
        """{tenant: {adapter name: directory}} as the key file in force declares them."""
        return {t: dict(names) for t, names in self._adapters.items()}

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
