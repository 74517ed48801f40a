"""keys.toml, parsed: API keys to tenants, operator keys, and the tenant table.

    [keys]                        # required; an empty table revokes every key
    "sk-alpha-..." = "alpha"

    [operators]                   # optional: keys for /metrics and /server_info
    "sk-ops-..." = "ops"          # key = a name for the logs

    [tenants.alpha]               # optional (bulkhead.server.tenants)
    weight = 2

Every mistake is a TenantTableError naming the file and the line. A file
with no [keys] table at all is a mistake, not "no keys": an editor that
truncates the file before writing it must not revoke everyone, so revoking
every key takes an explicit, empty [keys].
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass

from bulkhead.server.tenants import TenantPolicy, TenantTableError, entry_line, parse_tenant_table


@dataclass(frozen=True)
class KeyFile:
    keys: dict[str, str]  # API key -> tenant
    operators: dict[str, str]  # operator key -> operator name
    policies: dict[str, TenantPolicy]


def parse_key_file(text: str, source: str, env_keys: dict[str, str] | None = None) -> KeyFile:
    """source: the file's name for messages. env_keys: BULKHEAD_API_KEYS's
    key -> tenant (tenants a [tenants] entry may name, keys an operator key
    may not reuse)."""
    env_keys = env_keys or {}
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:  # its message names the line and column
        raise TenantTableError(f"{source}: not valid TOML: {e}") from None
    if "keys" not in data:
        raise TenantTableError(f"{source}: no [keys] table (an empty [keys] table revokes every key)")
    keys = _key_table(data["keys"], "keys", "tenant", source, text)
    operators = _key_table(data.get("operators", {}), "operators", "operator name", source, text)
    for key in operators.keys() & (keys.keys() | env_keys.keys()):
        where = f"{source}:{entry_line(text, 'operators', key)}"
        raise TenantTableError(f"{where}: [operators] a key is either a tenant's or an operator's, not both")
    policies = parse_tenant_table(data.get("tenants"), set(keys.values()) | set(env_keys.values()), source, text)
    return KeyFile(keys, operators, policies)


def _key_table(table: object, name: str, what: str, source: str, text: str) -> dict[str, str]:
    if not isinstance(table, dict):
        raise TenantTableError(f"{source}:{entry_line(text, name)}: [{name}] must be a table of \"key\" = \"{what}\"")
    for key, value in table.items():
        if not isinstance(value, str) or not value:
            raise TenantTableError(f"{source}:{entry_line(text, name, key)}: [{name}] the {what} of a key must be "
                                   f"a non-empty string, got {value!r}")
    return dict(table)
