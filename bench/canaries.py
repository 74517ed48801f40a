"""Per-request canaries and the cross-tenant check. Pure Python.

Every soak prompt carries a canary minted for the tenant that sends it. A
response to tenant Y that holds a canary minted for tenant X != Y is a hit:
text from X's prompt reached Y's output, the incident's failure. The model
is asked to repeat its own canary, so `echoes` (responses holding their own
canary) shows the check can see canaries at all; a run with no echoes would
prove nothing.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

PATTERN = re.compile(r"ZQ-[0-9a-f]{8}")


@dataclass(frozen=True)
class CanaryHit:
    receiver: str  # the tenant whose response held it
    owner: str  # the tenant whose prompt carried it
    canary: str


@dataclass
class CanaryLedger:
    owner_of: dict[str, str] = field(default_factory=dict)  # canary -> tenant
    hits: list[CanaryHit] = field(default_factory=list)
    echoes: int = 0  # responses that repeated their own canary
    unowned: int = 0  # canary-shaped strings nobody minted (model invention, not a leak)

    def mint(self, tenant: str) -> str:
        while True:
            canary = f"ZQ-{secrets.token_hex(4)}"
            if canary not in self.owner_of:
                self.owner_of[canary] = tenant
                return canary

    def check(self, receiver: str, own_canary: str, text: str) -> list[CanaryHit]:
        """Scan one response's text (whole or partial); record and return cross-tenant hits."""
        found = []
        for canary in set(PATTERN.findall(text)):
            owner = self.owner_of.get(canary)
            if owner is None:
                self.unowned += 1
            elif owner != receiver:
                found.append(CanaryHit(receiver, owner, canary))
        if own_canary in text:
            self.echoes += 1
        self.hits.extend(found)
        return found
