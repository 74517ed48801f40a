"""The `[tenants.NAME.adapters]` tables of keys.toml: which adapters each tenant owns.

    [tenants.alpha.adapters]
    sql = "/srv/adapters/alpha-sql"     # name = a PEFT directory
    chat = "adapters/alpha-chat"        # relative to the keys file's directory

A name is what the tenant's requests put in `model`; two tenants may each
have one called `sql`, and neither sees the other's. A name may not be the
base model's (a request naming it must get the base model) and must be a
plain token. A mistake in one entry leaves that adapter out (it serves
nobody: closed) and is reported beside the keys file's other problems.
"""

from __future__ import annotations

import re
from pathlib import Path

from bulkhead.server.tenants import entry_line

ADAPTERS_KEY = "adapters"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


def parse_adapter_tables(tenants: object, source: str, text: str, base_model_id: str | None = None,
                         problems: list[str] | None = None) -> dict[str, dict[str, Path]]:
    """{tenant: {adapter name: directory}} from the parsed [tenants] table;
    each mistake is appended to `problems` and its entry left out."""
    problems = [] if problems is None else problems
    out: dict[str, dict[str, Path]] = {}
    if not isinstance(tenants, dict):
        return out
    here = Path(source).parent
    for tenant, entry in tenants.items():
        table = entry.get(ADAPTERS_KEY) if isinstance(entry, dict) else None
        if table is None:
            continue
        section = f"tenants.{tenant}.{ADAPTERS_KEY}"
        if not isinstance(table, dict):
            problems.append(f"{source}:{entry_line(text, section)}: [{section}] must be a table of "
                            "name = \"directory\"")
            continue
        for name, directory in table.items():
            at = f"{source}:{entry_line(text, section, name)}: [{section}] {name}"
            if not _NAME.fullmatch(name):
                problems.append(f"{at}: an adapter name is letters, digits and . _ : / - (at most 128), "
                                f"starting with a letter or digit, got {name!r}")
            elif name == base_model_id:
                problems.append(f"{at}: the base model's name; requests naming it get the base model")
            elif not isinstance(directory, str) or not directory:
                problems.append(f"{at}: must be a directory path as a string, got {directory!r}")
            else:
                out.setdefault(tenant, {})[name] = here / Path(directory).expanduser()
    return out
