"""Per-tenant KV quotas: who may keep pages when tenants compete. Pure Python.

A tenant's quota is its share of the pool: by default the weighted fair
share among the active tenants (pool * weight / sum of active weights), or
the fraction its tenant-table entry sets. Quotas are enforced only when the
pool runs out, so a tenant alone may fill it (work-conserving):

    who needs a page   | may take pages from
    -------------------+-----------------------------------------------------
    a running request  | the tenant furthest over its quota, if any is; else
                       | its own tenant's newest request (possibly itself)
    a waiting request  | only another tenant over its quota, and only while
    whose tenant stays |   its own tenant stays within quota
    within quota       |
    any other waiting  | nobody: it waits for free pages
    request            |

A tenant within its quota never loses a page to another tenant.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum, auto


class Preempt(Enum):
    """Whom a request that needs pages may preempt (the table above)."""

    ANY = auto()  # a running request: kv_quota's choice, its own tenant's newest request included
    OTHERS_OVER_QUOTA = auto()  # a waiting request within quota: only another tenant's, over its quota
    NOBODY = auto()  # waits for free pages (a pass in flight, or a request over its quota)


def quotas(num_pages: int, active: list[str], weight_of: Callable[[str], float],
           share_of: Callable[[str], float | None]) -> dict[str, int]:
    """Pages each active tenant may hold while others compete for the pool."""
    fixed = {t: share_of(t) for t in active if share_of(t) is not None}
    total = sum(weight_of(t) for t in active if t not in fixed)
    left = max(0.0, 1.0 - sum(fixed.values()))
    out = {}
    for t in active:
        fraction = fixed[t] if t in fixed else left * weight_of(t) / total
        out[t] = int(num_pages * fraction)
    return out


def victim_tenant(held: dict[str, int], quota: dict[str, int], requester: str, need: int,
                  may_take_own: bool) -> str | None:
    """The tenant to preempt a request of so that `requester` gets `need`
    more pages, or None. held: pages each tenant's running requests hold;
    may_take_own: False for a waiting request (the table's second row)."""
    mine = held.get(requester, 0) + need - quota.get(requester, 0)  # > 0: over quota once served
    if not may_take_own and mine > 0:
        return None
    over = {t: n - quota.get(t, 0) for t, n in held.items() if t != requester and n > quota.get(t, 0)}
    if over:
        worst = max(over, key=lambda t: (over[t], t))
        if not (may_take_own and mine > over[worst]):  # the requester pays if it is further over
            return worst
    return requester if may_take_own else None
