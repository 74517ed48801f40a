"""keys.toml, parsed: API keys to tenants, operator keys, and the tenant table.

    [keys]                        # required; an empty table revokes every key
    "sk-alpha-..." = "alpha"

    [operators]                   # optional: keys for /metrics and /server_info
    "sk-ops-..." = "ops"          # key = a name for the logs

    [tenants.alpha]               # optional: limits (bulkhead.server.tenants)
    weight = 2

    [tenants.alpha.adapters]      # optional: the tenant's LoRA adapters, name = a PEFT directory
    sql = "/srv/adapters/alpha-sql"   # relative paths: to the keys file's directory

An adapter name is what the tenant's requests put in `model`; two tenants
may each have one called `sql`, and neither sees the other's. It may not be
the base model's name (a request naming that gets the base model).

Two kinds of mistake, because a reload must never keep a removed key alive:
KeyFileUnreadable (not TOML, or no [keys] table: nothing in it can be
trusted, and an editor that truncates the file must not revoke everyone),
after which a reload keeps the last good keys and says loudly that
revocations in the file are not in force; and anything else (a bad entry, a
key both a tenant's and an operator's, a mistake in the tenant table), which
the parse records and gets past *closed*: a bad entry authorises nothing, a
tenant table with a mistake is refused whole while [keys] and [operators]
apply. Start-up refuses every problem; a reload applies what it can.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from bulkhead.server.tenants import TenantPolicy, TenantTableError, entry_line, parse_tenant_table


_ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


class KeyFileUnreadable(TenantTableError):
    """The file cannot be read as a key file at all: the last good keys stay."""


@dataclass(frozen=True)
class KeyFile:
    keys: dict[str, str]  # API key -> tenant; entries with a mistake left out
    operators: dict[str, str]  # operator key -> operator name; entries with a mistake left out
    policies: dict[str, TenantPolicy] | None  # None: the tenant table has a mistake and is refused
    adapters: dict[str, dict[str, Path]]  # tenant -> adapter name -> directory; entries with a mistake left out
    problems: tuple[str, ...]  # every mistake, each naming the file and the line


def parse_key_file(text: str, source: str, env_keys: dict[str, str] | None = None,
                   base_model_id: str | None = None) -> KeyFile:
    """source: the file's name for messages. env_keys: BULKHEAD_API_KEYS's
    key -> tenant (tenants a [tenants] entry may name, keys an operator key
    may not reuse). Raises KeyFileUnreadable only; every other mistake is in
    `problems`, with the entry it concerns left out."""
    env_keys = env_keys or {}
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:  # its message names the line and column
        raise KeyFileUnreadable(f"{source}: not valid TOML: {e}") from None
    if "keys" not in data:
        raise KeyFileUnreadable(f"{source}: no [keys] table (an empty [keys] table revokes every key)")
    if not isinstance(data["keys"], dict):
        raise KeyFileUnreadable(f"{source}:{entry_line(text, 'keys')}: [keys] must be a table of \"key\" = \"tenant\"")
    problems: list[str] = []
    keys = _key_table(data["keys"], "keys", "tenant", source, text, problems)
    operators = _key_table(data.get("operators", {}), "operators", "operator name", source, text, problems)
    # A key in both tables is neither: which one the operator meant is a guess, and a guess must not grant.
    for key in sorted(operators.keys() & (keys.keys() | env_keys.keys())):
        where = f"{source}:{entry_line(text, 'operators', key)}"
        problems.append(f"{where}: [operators] a key is either a tenant's or an operator's, not both "
                        "(it opens nothing until one entry goes)")
        keys.pop(key, None)
        del operators[key]
    tenants = set(keys.values()) | set(env_keys.values())
    try:
        policies = parse_tenant_table(data.get("tenants"), tenants, source, text)
    except TenantTableError as e:
        problems.append(str(e))
        policies = None
    adapters = _adapter_tables(data.get("tenants"), source, text, base_model_id, problems)
    adapters = {t: names for t, names in adapters.items() if t in tenants}  # an unknown tenant: already a problem
    return KeyFile(keys, operators, policies, adapters, tuple(problems))


def _key_table(table: object, name: str, what: str, source: str, text: str, problems: list[str]) -> dict[str, str]:
    if not isinstance(table, dict):
        problems.append(f"{source}:{entry_line(text, name)}: [{name}] must be a table of \"key\" = \"{what}\"")
        return {}
    good = {}
    for key, value in table.items():
        if isinstance(value, str) and value:
            good[key] = value
        else:
            problems.append(f"{source}:{entry_line(text, name, key)}: [{name}] the {what} of a key must be "
                            f"a non-empty string, got {value!r}")
    return good


def _adapter_tables(tenants: object, source: str, text: str, base_model_id: str | None,
                    problems: list[str]) -> dict[str, dict[str, Path]]:
    """{tenant: {adapter name: directory}}; a mistake leaves its entry out (it serves nobody)."""
    out: dict[str, dict[str, Path]] = {}
    for tenant, entry in (tenants.items() if isinstance(tenants, dict) else ()):
        table = entry.get("adapters") if isinstance(entry, dict) else None
        if table is None:
            continue
        section = f"tenants.{tenant}.adapters"
        if not isinstance(table, dict):
            problems.append(f"{source}:{entry_line(text, section)}: [{section}] must be a table of "
                            "name = \"directory\"")
            continue
        for name, directory in table.items():
            at = f"{source}:{entry_line(text, section, name)}: [{section}] {name}"
            if not _ADAPTER_NAME.fullmatch(name):
                problems.append(f"{at}: an adapter name is letters, digits and . _ : / - (at most 128), "
                                f"starting with a letter or digit, got {name!r}")
            elif name == base_model_id:
                problems.append(f"{at}: the base model's name; requests naming it get the base model")
            elif not isinstance(directory, str) or not directory:
                problems.append(f"{at}: must be a directory path as a string, got {directory!r}")
            else:
                out.setdefault(tenant, {})[name] = Path(source).parent / Path(directory).expanduser()
    return out
