"""The [tenants.NAME] tables of keys.toml (bulkhead.server.keys_file): each
tenant's weight, KV share and limits, every one optional (a tenant without
an entry gets DEFAULT_POLICY). A mistake (a tenant no key names, a weight
<= 0, a limit that is not a number, an unknown field) is a
TenantTableError naming the entry and its line: `serve` refuses to start
on it, a reload keeps the last good table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


class TenantTableError(ValueError):
    pass


@dataclass(frozen=True)
class TenantPolicy:
    # Fair-queue weight: service is shared in proportion among busy tenants.
    weight: float = 1.0
    # Fraction of the KV pool this tenant keeps when tenants compete for
    # pages; None = its weighted fair share of the active tenants.
    kv_share: float | None = None
    # Requests in flight at once (HTTP requests, whatever their `n`).
    max_concurrent: int | None = None
    # In-flight requests still waiting for their first token.
    max_queued: int | None = None
    # Token buckets refilled continuously; a burst of a minute's worth is allowed.
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None  # prompt + max_tokens of each request, charged on admission


DEFAULT_POLICY = TenantPolicy()

# field -> (smallest allowed value, whether it must be a whole number, whether the minimum is excluded)
_RULES = {
    "weight": (0.0, False, True),
    "kv_share": (0.0, False, True),
    "max_concurrent": (1, True, False),
    "max_queued": (0, True, False),
    "requests_per_minute": (0.0, False, True),
    "tokens_per_minute": (0.0, False, True),
}
assert set(_RULES) == {f.name for f in fields(TenantPolicy)}


def parse_tenant_table(table: object, known_tenants: set[str], source: str, text: str) -> dict[str, TenantPolicy]:
    """The [tenants] table of a parsed keys.toml. source: the file's name for
    messages; text: its contents, to name the line of a mistake."""
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise TenantTableError(f"{source}:{entry_line(text, 'tenants')}: [tenants] must be a table of [tenants.NAME] tables")
    out = {}
    for tenant, entry in table.items():
        where = f"{source}:{entry_line(text, f'tenants.{tenant}')}: [tenants.{tenant}]"
        if tenant not in known_tenants:
            raise TenantTableError(f"{where}: no API key names tenant {tenant!r} (known: {sorted(known_tenants)})")
        if not isinstance(entry, dict):
            raise TenantTableError(f"{where}: expected a table of limits, got {entry!r}")
        values = {}
        for name, value in entry.items():
            if name == "adapters":
                continue  # the tenant's LoRA adapters: keys_file._adapter_tables
            at = f"{source}:{entry_line(text, f'tenants.{tenant}', name)}: [tenants.{tenant}] {name}"
            if name not in _RULES:
                raise TenantTableError(f"{at}: unknown field (known: {', '.join(_RULES)})")
            values[name] = _check(at, name, value)
        if values.get("kv_share", 0) > 1:
            raise TenantTableError(f"{where} kv_share: a fraction of the pool, at most 1, got {values['kv_share']}")
        out[tenant] = TenantPolicy(**values)
    shares = sum(p.kv_share or 0 for p in out.values())
    if shares > 1:
        raise TenantTableError(f"{source}: kv_share values add up to {shares:g}, more than the whole pool (1)")
    return out


def _check(at: str, name: str, value: object) -> float | int:
    least, whole, strict = _RULES[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TenantTableError(f"{at}: must be a number, got {value!r}")
    if whole and value != int(value):
        raise TenantTableError(f"{at}: must be a whole number, got {value!r}")
    if value < least or (strict and value == least):
        raise TenantTableError(f"{at}: must be {'>' if strict else '>='} {least:g}, got {value!r}")
    return int(value) if whole else float(value)


def entry_line(text: str, section: str, key: str | None = None) -> int:
    """The line of `[section]` (or of `key =` inside it), best effort:
    tomllib reports no positions for values it parsed."""
    header = None
    for i, raw in enumerate(text.splitlines()):
        line = raw.strip()
        if line.startswith("["):
            name = line.strip("[]").strip().replace('"', "").replace("'", "")
            if header is not None:
                break  # left the section without finding the key
            if name == section:
                header = i
                if key is None:
                    return i + 1
        elif header is not None and line.split("=", 1)[0].strip().strip('"\'') == key:
            return i + 1
    return header + 1 if header is not None else 1
