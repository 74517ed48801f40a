"""Per-run canaries for `bulkhead probe`: each owned by the tenant whose prompt
carries it; a response to one tenant holding another's canary is a finding.
A finding names the tenants and the canary, never the response's text."""

from __future__ import annotations

import re
import secrets
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeFinding:
    check: str
    message: str
    tenants: tuple[str, ...] = ()
    canary: str | None = None


class Canaries:
    def __init__(self) -> None:
        self._owner: dict[str, str] = {}
        self._lock = threading.Lock()
        self.hits: list[ProbeFinding] = []
        self._seen: set[tuple[str, str, str]] = set()

    def new(self, tenant: str) -> str:
        with self._lock:
            while True:
                canary = f"ZQ-{secrets.token_hex(3)}"
                if canary not in self._owner:
                    self._owner[canary] = tenant
                    return canary

    def scan(self, receiver: str, text: str, where: str) -> None:
        if not text:
            return
        with self._lock:
            for canary in set(re.findall(r"ZQ-[0-9a-f]{6}", text)):
                owner = self._owner.get(canary)
                if owner is None or owner == receiver or (receiver, owner, canary) in self._seen:
                    continue
                self._seen.add((receiver, owner, canary))
                self.hits.append(ProbeFinding("cross_tenant", f"{where}: a response to tenant {receiver!r} "
                                              f"contained canary {canary} from a prompt of tenant {owner!r}",
                                              (receiver, owner), canary))
