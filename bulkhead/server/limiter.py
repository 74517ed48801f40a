"""Per-tenant request limits (bulkhead.server.tenants), checked before
anything is submitted: a request over one is a typed 429 naming the limit
and its value, with a Retry-After, and never reaches the engine.
Concurrency and queue depth are counted from the in-flight registry
(nothing to leak: an entry leaves however its request ends); rates are
token buckets.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from bulkhead.errors import RateLimited
from bulkhead.server.inflight import InFlightRequests
from bulkhead.server.tenants import TenantPolicy


class _Bucket:
    """Holds up to `per_minute`, refilled at per_minute / 60 a second."""

    def __init__(self, per_minute: float, now: float):
        self.capacity = per_minute
        self.level = per_minute
        self.stamp = now

    def refill(self, per_minute: float, now: float) -> None:
        self.capacity = per_minute  # a reloaded table changes the rate at once
        self.level = min(per_minute, self.level + (now - self.stamp) * per_minute / 60.0)
        self.stamp = now

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` can be taken (a request bigger than the
        bucket waits for a full one, then drives it below zero)."""
        short = min(amount, self.capacity) - self.level
        return 0.0 if short <= 0 else short * 60.0 / self.capacity


class TenantLimiter:
    def __init__(self, policy_of: Callable[[str], TenantPolicy], inflight: InFlightRequests,
                 clock: Callable[[], float] = time.monotonic):
        self.policy_of = policy_of
        self.inflight = inflight
        self.clock = clock
        self._requests: dict[str, _Bucket] = {}
        self._tokens: dict[str, _Bucket] = {}
        self.throttled: dict[tuple[str, str], int] = {}  # (tenant, limit) -> requests refused

    def check(self, tenant: str, tokens: int) -> None:
        """Take one request and `tokens` (prompt + max_tokens of every choice)
        from the tenant's allowance, or raise RateLimited and take nothing."""
        p = self.policy_of(tenant)
        if p.max_concurrent is not None and self.inflight.count(tenant) >= p.max_concurrent:
            self._refuse(tenant, "max_concurrent", p.max_concurrent, self.inflight.count(tenant) + 1, 1.0,
                         "requests", "requests in flight at once")
        if p.max_queued is not None and self.inflight.count(tenant, queued=True) >= p.max_queued:
            self._refuse(tenant, "max_queued", p.max_queued, self.inflight.count(tenant, queued=True) + 1, 1.0,
                         "requests", "requests waiting for their first token")
        now = self.clock()
        checks = []
        if p.requests_per_minute is not None:
            checks.append(("requests_per_minute", p.requests_per_minute, self._requests, 1, "requests"))
        if p.tokens_per_minute is not None:
            checks.append(("tokens_per_minute", p.tokens_per_minute, self._tokens, tokens, "tokens"))
        for name, rate, buckets, amount, kind in checks:
            bucket = buckets.setdefault(tenant, _Bucket(rate, now))
            bucket.refill(rate, now)
            wait = bucket.wait_for(amount)
            if wait > 0:
                self._refuse(tenant, name, rate, amount, wait, kind, f"{kind} per minute, this request asks for "
                             f"{amount:g} and {max(bucket.level, 0):.0f} are left")
        for _, _, buckets, amount, _ in checks:
            buckets[tenant].level -= amount

    def _refuse(self, tenant: str, limit: str, value: float, asked: float, retry_after: float, kind: str,
                what: str) -> None:
        self.throttled[(tenant, limit)] = self.throttled.get((tenant, limit), 0) + 1
        retry = max(1, math.ceil(retry_after))
        raise RateLimited(f"Rate limit reached for tenant {tenant!r}: {limit} = {value:g} ({what}). "
                          f"Try again in {retry}s.", param=limit, limit=value, value=asked, retry_after=retry,
                          kind=kind)
