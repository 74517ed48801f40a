"""The simulated clients: two tenants, a few requests each, some over-length.

A client does what the HTTP layer does for a disaggregated server: one
admission decision against the router's live limits (`admit`), then the
router's `generate` until the one terminal output, an error, or its own
departure (client_abort). Each prompt is its request's canary token repeated.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from bulkhead.disagg.router import DisaggBackend
from bulkhead.engine.admission import Rejection, admit
from bulkhead.engine.request import SamplingParams
from bulkhead.errors import BulkheadError
from bulkhead.sim.context import SimContext

TENANTS = ("alpha", "beta")
FIRST_CANARY = 100


@dataclass(frozen=True)
class SimRequest:
    request_id: str
    tenant: str
    canary: int  # every prompt token, and (greedy, over its own KV) every generated token
    prompt_len: int
    max_tokens: int
    arrives_s: float
    abort_after_s: float | None  # client_abort: leaves this long after sending


@dataclass
class Outcome:
    """What the client saw. kind: success | error | rejected | aborted."""

    kind: str | None = None
    code: str | None = None  # finish reason (success) or error code
    tokens: list[int] = field(default_factory=list)
    terminal_events: int = 0
    admitted: bool = False


def make_workload(ctx: SimContext, over_limit_tokens: int) -> list[SimRequest]:
    """5-7 requests from two tenants; about one in five does not fit the limit."""
    rng, plan = ctx.rng, ctx.plan
    requests = []
    for i in range(rng.randint(5, 7)):
        if rng.random() < 0.2:
            prompt_len = rng.randint(over_limit_tokens - 4, over_limit_tokens + 12)  # too long with max_tokens
            max_tokens = rng.randint(5, 8)
        else:
            prompt_len, max_tokens = rng.randint(1, 20), rng.randint(1, 6)
        abort = rng.uniform(0.0, 0.6) if plan.client_abort and rng.random() < plan.client_abort else None
        requests.append(SimRequest(f"r{i}", rng.choice(TENANTS), FIRST_CANARY + i, prompt_len, max_tokens,
                                   rng.uniform(0.1, 1.5), abort))
    return requests


async def run_client(ctx: SimContext, router: DisaggBackend, req: SimRequest, outcome: Outcome) -> None:
    await asyncio.sleep(req.arrives_s)
    ctx.log(f"client {req.request_id} ({req.tenant}) sends {req.prompt_len}+{req.max_tokens} tokens")
    task = asyncio.current_task()
    leave = ctx.after(req.abort_after_s, task.cancel) if req.abort_after_s is not None else None
    try:
        await _request(router, req, outcome)
    except asyncio.CancelledError:
        outcome.kind, outcome.code = "aborted", "client_left"
        outcome.terminal_events += 1
        ctx.fire("client_abort", f"client of {req.request_id} leaves")
    except BulkheadError as e:
        outcome.kind, outcome.code = "error", e.code
        outcome.terminal_events += 1
    finally:
        if leave is not None:
            leave.cancel()
    ctx.log(f"client {req.request_id} ends: {outcome.kind} {outcome.code} tokens={outcome.tokens}")


async def _request(router: DisaggBackend, req: SimRequest, outcome: Outcome) -> None:
    limits = router.limits  # Overloaded (503) with no live pair
    params = SamplingParams(max_tokens=req.max_tokens, temperature=0.0, ignore_eos=True)
    decision = admit(req.request_id, req.tenant, [req.canary] * req.prompt_len, params, limits)
    if isinstance(decision, Rejection):
        outcome.kind, outcome.code = "rejected", decision.error.code
        outcome.terminal_events += 1
        return
    outcome.admitted = True
    async for _, out in router.generate([decision]):
        outcome.tokens.extend(out.token_ids)
        if out.finished:
            outcome.terminal_events += 1
            if out.error is not None:
                outcome.kind, outcome.code = "error", out.error.code
            else:
                outcome.kind, outcome.code = "success", out.finish_reason
