"""Each tenant's service, queue and pages as the scheduler holds them: the
figures /metrics and /server_info show. Reads copies, never mutates."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bulkhead.engine.kv_quota import quotas

if TYPE_CHECKING:
    from bulkhead.engine.scheduler import Scheduler


def tenant_stats(s: Scheduler) -> dict[str, dict]:
    """Per-tenant service, queue and pages, for /metrics and /server_info.
    Safe to call from another thread: it reads copies, never mutates."""
    counters, served = dict(s.waiting.counters), dict(s.waiting.served)
    running = list(s.running)
    held: dict[str, int] = {}
    for r in running:
        held[r.tenant] = held.get(r.tenant, 0) + len(s.ledger.pages_of(r.request_id))
    active = list(s.waiting.active)
    quota = quotas(s.ledger.num_pages, sorted(active), s.shares.weight, s.shares.kv_share) if active else {}
    out = {}
    for t in sorted(set(counters) | set(held)):
        prompt, output = served.get(t, (0, 0))
        out[t] = {"service": round(counters.get(t, 0.0), 1), "prompt_tokens_served": prompt,
                  "output_tokens_served": output, "waiting": s.waiting.depth(t),
                  "running": sum(1 for r in running if r.tenant == t), "kv_pages": held.get(t, 0),
                  "kv_quota": quota.get(t), "quota_preemptions": s.quota_preemptions.get(t, 0)}
    return out
