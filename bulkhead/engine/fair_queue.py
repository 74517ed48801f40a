"""Fair service across tenants: virtual token counters (VTC). Pure Python.

Sheng et al., "Fairness in Serving Large Language Models" (OSDI 2024). Each
tenant's counter is the service it received: prompt tokens as prefilled and
output tokens as sampled, each at its cost, divided by its weight. The
scheduler's PrefillOrder (prefill_order.py) serves the least counter among
tenants with work. A tenant that becomes active is lifted to the least
counter of the active tenants, so idle time is not banked (no catch-up
burst). Two backlogged tenants' counters then differ by about one
request's cost per batch slot at most; a tenant alone is served as fast as
the engine goes (work-conserving). The queue also holds the waiting
requests, per tenant in arrival order; the scheduler owns running ones.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from bulkhead.engine.request import Request


class FairQueue:
    def __init__(self, weight_of: Callable[[str], float], prompt_cost: float = 1.0, output_cost: float = 2.0):
        """weight_of(tenant): its share weight (> 0), read at every charge so a
        reloaded tenant table takes effect at once."""
        self.weight_of = weight_of
        self.prompt_cost = prompt_cost
        self.output_cost = output_cost
        self.counters: dict[str, float] = {}
        # Raw tokens served per tenant since start: (prompt, output). Metrics only.
        self.served: dict[str, list[int]] = {}
        self._waiting: dict[str, deque[Request]] = {}
        self._live: dict[str, int] = {}  # requests per tenant the scheduler holds in any state
        self._floor = 0.0  # least counter of the active tenants, last time there were any

    # -- who is active ---------------------------------------------------------
    def join(self, tenant: str) -> None:
        """A request of `tenant` became live. The first one lifts its counter."""
        if not self._live.get(tenant):
            floor = min((self.counters[t] for t in self._live), default=self._floor)
            self.counters[tenant] = max(self.counters.get(tenant, 0.0), floor)
        self._live[tenant] = self._live.get(tenant, 0) + 1

    def leave(self, tenant: str) -> None:
        """A request of `tenant` ended (finished, aborted or handed over)."""
        left = self._live[tenant] - 1
        if left:
            self._live[tenant] = left
            return
        del self._live[tenant]
        if not self._live:
            self._floor = max(self._floor, self.counters[tenant])
        else:
            self._floor = max(self._floor, min(self.counters[t] for t in self._live))

    @property
    def active(self) -> dict[str, int]:
        return dict(self._live)

    # -- service -----------------------------------------------------------------
    def charge(self, tenant: str, prompt_tokens: int = 0, output_tokens: int = 0) -> None:
        cost = prompt_tokens * self.prompt_cost + output_tokens * self.output_cost
        self.counters[tenant] = self.counters.get(tenant, 0.0) + cost / self.weight_of(tenant)
        served = self.served.setdefault(tenant, [0, 0])
        served[0] += prompt_tokens
        served[1] += output_tokens

    def finish_tag(self, tenant: str, next_tokens: int) -> float:
        """The service tenant would have after a chunk of next_tokens prompt
        tokens (prefill_order.LeastServedFirst ranks by it)."""
        return self.counters.get(tenant, 0.0) + next_tokens * self.prompt_cost / self.weight_of(tenant)

    # -- the waiting requests ----------------------------------------------------
    def append(self, req: Request) -> None:
        self._waiting.setdefault(req.tenant, deque()).append(req)

    def appendleft(self, req: Request) -> None:
        """A preempted request goes back to the front of its tenant's line."""
        self._waiting.setdefault(req.tenant, deque()).appendleft(req)

    def remove(self, req: Request) -> None:
        line = self._waiting[req.tenant]
        line.remove(req)
        if not line:
            del self._waiting[req.tenant]

    def heads(self) -> list[Request]:
        """The first waiting request of each tenant."""
        return [line[0] for line in self._waiting.values()]

    def depth(self, tenant: str) -> int:
        return len(self._waiting.get(tenant, ()))

    def __len__(self) -> int:
        return sum(len(line) for line in self._waiting.values())

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def __iter__(self) -> Iterator[Request]:
        return iter(sorted((r for line in self._waiting.values() for r in line), key=lambda r: r.arrival))

    def check_integrity(self, live: dict[str, int]) -> None:
        """live: requests per tenant that the scheduler holds (waiting, running, kept)."""
        if live != self._live:
            raise AssertionError(f"fair queue counts live requests {self._live}, scheduler holds {live}")
        for tenant, line in self._waiting.items():
            if not line or any(r.tenant != tenant for r in line):
                raise AssertionError(f"waiting line of {tenant} is empty or holds another tenant's request")
        if self._live:
            least = min(self.counters[t] for t in self._live)
            if least < self._floor - 1e-9:
                raise AssertionError(f"an active tenant's counter {least} is below the floor {self._floor}")
