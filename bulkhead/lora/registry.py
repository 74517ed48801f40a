"""Which adapters each tenant owns, validated, and the one way a name is resolved.

A request's `model` is looked up in its own tenant's table only
(`resolve`): another tenant's adapter of that name is not found, exactly
as a name that exists nowhere is, so a 404 says nothing about other
tenants. The tables follow keys.toml (`follow`): when the key store
applies a new file, the next lookup re-reads the declared directories. A
directory whose files did not change (same size and mtime) keeps its
validation; one that fails is left out, logged with the file and the
reason, and every other adapter keeps serving. The swap is one assignment:
a request resolved before a reload holds its Adapter and finishes on it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from bulkhead.lora import products
from bulkhead.lora.peft_files import (MAX_BYTES, MAX_RANK, AdapterFiles, AdapterRefused, BaseShapes, read_adapter,
                                      fp32_bytes, packed_bytes, resident_bytes)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Adapter:
    tenant: str
    name: str
    files: AdapterFiles


class AdapterRegistry:
    def __init__(self, base: BaseShapes, max_rank: int = MAX_RANK, max_bytes: int = MAX_BYTES):
        self.base, self.max_rank, self.max_bytes = base, max_rank, max_bytes
        self._by_tenant: dict[str, dict[str, Adapter]] = {}
        self._validated: dict[Path, tuple[tuple[int, int], AdapterFiles]] = {}
        self.problems: tuple[str, ...] = ()  # the adapters left out by the last sync, each with its reason
        self._keys = None
        self._generation = None
        self._lock = threading.Lock()

    def follow(self, keys) -> AdapterRegistry:
        """Take the adapter tables from a bulkhead.server.auth.KeyStore, now and after each reload."""
        self._keys = keys
        self._refresh()
        return self

    def sync(self, declared: dict[str, dict[str, Path]]) -> tuple[str, ...]:
        """Replace the tables with `declared` ({tenant: {name: directory}});
        returns the problems (adapters refused)."""
        tables: dict[str, dict[str, Adapter]] = {}
        problems = []
        for tenant, names in sorted(declared.items()):
            for name, path in sorted(names.items()):
                try:
                    files = self._read(Path(path))
                except AdapterRefused as e:
                    problems.append(f"tenant {tenant!r} adapter {name!r} refused: {e}")
                    continue
                tables.setdefault(tenant, {})[name] = Adapter(tenant, name, files)
        for problem in problems:
            if problem not in self.problems:
                log.error("%s", problem)
        self._by_tenant, self.problems = tables, tuple(problems)
        return self.problems

    def _read(self, path: Path) -> AdapterFiles:
        try:
            st = (path / "adapter_model.safetensors").stat()
            stamp = (st.st_size, st.st_mtime_ns)
        except OSError:
            stamp = None
        known = self._validated.get(path)
        if stamp is not None and known is not None and known[0] == stamp:
            return known[1]
        files = read_adapter(path, self.base, self.max_rank, self.max_bytes)
        if stamp is not None:
            self._validated[path] = (stamp, files)
        return files

    def _refresh(self) -> None:
        if self._keys is None or self._keys.generation == self._generation:
            return
        with self._lock:  # one re-read per reload, however many requests arrive meanwhile
            if self._keys.generation != self._generation:
                self.sync(self._keys.adapters)
                self._generation = self._keys.generation

    def resolve(self, tenant: str, name: str) -> Adapter | None:
        """The tenant's adapter called `name`, or None: none of its own has that name."""
        self._refresh()
        return self._by_tenant.get(tenant, {}).get(name)

    def names(self, tenant: str) -> list[str]:
        """The tenant's own adapters, for its /v1/models."""
        self._refresh()
        return sorted(self._by_tenant.get(tenant, {}))

    def info(self) -> dict:
        """/server_info's `adapters` (operator key only): each tenant's adapters, what each costs, what was refused."""
        tenants: dict[str, dict] = {}
        for a in self.loaded():
            tenants.setdefault(a.tenant, {})[a.name] = {
                "rank": a.files.rank, "scaling": a.files.scaling, "modules": len(a.files.targets),
                "digest": a.files.digest[:16], "file_bytes": a.files.nbytes,
                # the default kernels' one copy, packed for this machine's products (bulkhead.lora.products)
                "resident_bytes": resident_bytes(a.files, self.base), "products": products.preferred(),
                "fp32_bytes": fp32_bytes(a.files, self.base),
                "packed_bytes": packed_bytes(a.files, self.base, products.preferred())}
        return {"tenants": tenants, "refused": list(self.problems),
                "resident_bytes": sum(e["resident_bytes"] for t in tenants.values() for e in t.values())}

    def loaded(self) -> list[Adapter]:
        """Every tenant's adapters: operator views only."""
        self._refresh()
        return [a for names in self._by_tenant.values() for a in names.values()]
