"""Continuous batching over the page ledger. Pure Python: no torch.

The scheduler holds the requests (waiting in a fair queue, running in the
batch, kept or reserved for a KV transfer) and composes one concept per
module to plan each step:

    fair_queue.py      the waiting lines and each tenant's service (VTC)
    prefill_order.py   which prompt goes next (first come, first served: measurement only)
    chunk_planning.py  a step's decode rows and prefill chunks within its budget
    pass_slices.py     a long pass handed out a slice of layers per step
    decode_rounds.py   a large decode batch handed out a group of rows per step
    page_growth.py     pages for a request's next positions; preemption
    kv_quota.py        whom a request may preempt when tenants compete
    prefix_pins.py     the prefix-cache pages a request reads

scheduler_integrity.py checks that they agree (check_integrity()).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from bulkhead.engine.admission import Admitted
from bulkhead.engine.chunk_planning import ChunkPlanner
from bulkhead.engine.fair_queue import FairQueue
from bulkhead.engine.kv_quota import quotas
from bulkhead.engine.page_growth import PageGrowth
from bulkhead.engine.pass_slices import InFlightPass
from bulkhead.engine.prefill_order import FirstComeFirstServed, LeastServedFirst, PrefillOrder
from bulkhead.engine.prefix_pins import PrefixPins
from bulkhead.engine.request import FinishReason, Request, RequestStatus
from bulkhead.engine.scheduler_config import SchedulerConfig, TenantShares  # noqa: F401 (likewise)
from bulkhead.engine.scheduler_integrity import check_scheduler
from bulkhead.engine.step_plan import DecodeWork, PrefillWork, StepPlan  # noqa: F401 (importers read them here)
from bulkhead.kv.ledger import PageLedger
from bulkhead.kv.prefix_cache import PrefixCache


class QueueFull(RuntimeError):
    pass


class Scheduler:
    def __init__(self, config: SchedulerConfig, ledger: PageLedger, reclaim: Callable[[], None],
                 cache_secret: bytes = b"", shares: TenantShares | None = None):
        """reclaim() scrubs every dirty page and marks it scrubbed (the scheduler
        never touches KV bytes). cache_secret: what tenant cache salts derive
        from. shares: replaced (a reloaded tenant table) between steps."""
        self.config = config
        self.ledger = ledger
        self.reclaim = reclaim
        self.shares = shares or TenantShares()
        self.pins = PrefixPins(PrefixCache(ledger) if config.prefix_cache else None, config.page_size, cache_secret)
        self.cache = self.pins.cache
        # Pages outside the batch, for a KV transfer: a prefill hand-over's
        # finished request, kept until its pages are sent, and decode's
        # WAITING_FOR_REMOTE_KV reservation (request id -> tenant) until the
        # verified KV starts decoding (add_prefilled); both end in release_reserved.
        self.kept: dict[str, Request] = {}
        self.awaiting_remote_kv: dict[str, str] = {}
        self.requests: dict[str, Request] = {}
        self.waiting = FairQueue(lambda t: self.shares.weight(t), config.prompt_token_cost,
                                 config.output_token_cost)
        # Chosen once: fair queueing, or first come, first served to measure what it costs.
        self.order: PrefillOrder = LeastServedFirst(self.waiting) if config.fair else FirstComeFirstServed()
        self.running: list[Request] = []
        # The one chunk whose pass runs a slice of layers per step (pass_slices.py), if any.
        self.in_flight: InFlightPass | None = None
        self.growth = PageGrowth(self)
        self.planner = ChunkPlanner(self)
        self._arrivals = itertools.count()  # strict order; clocks can tie

    @property
    def num_preemptions(self) -> int:
        return self.growth.num_preemptions

    @property
    def quota_preemptions(self) -> dict[str, int]:  # a tenant's requests preempted for another tenant
        return self.growth.quota_preemptions

    # -- intake --------------------------------------------------------------
    def add(self, ticket: Admitted) -> Request:
        self._check_new(ticket)
        if len(self.waiting) >= self.config.max_waiting:
            raise QueueFull(f"{len(self.waiting)} requests already waiting")
        req = Request(ticket.request_id, ticket.tenant, list(ticket.prompt_token_ids), ticket.params,
                      next(self._arrivals), adapter=ticket.adapter.digest if ticket.adapter else None)
        self.pins.hash_prompt(req, ticket.cache_salt)
        self.requests[req.request_id] = req
        self.waiting.join(req.tenant)
        self.waiting.append(req)
        return req

    def add_prefilled(self, ticket: Admitted, first_token: int) -> Request:
        """A request whose prompt KV already sits in pages it owns (written by
        a prefill worker and verified): it joins the batch ready to decode."""
        self._check_new(ticket)
        held = len(self.ledger.pages_of(ticket.request_id)) * self.config.page_size
        if held < len(ticket.prompt_token_ids):
            raise ValueError(f"{ticket.request_id} owns {held} slots for {len(ticket.prompt_token_ids)} prompt tokens")
        self.awaiting_remote_kv.pop(ticket.request_id, None)  # its pages are the running request's now
        req = Request(ticket.request_id, ticket.tenant, list(ticket.prompt_token_ids), ticket.params,
                      next(self._arrivals), output_token_ids=[first_token],
                      num_computed=len(ticket.prompt_token_ids), status=RequestStatus.RUNNING,
                      adapter=ticket.adapter.digest if ticket.adapter else None)
        req.charged = req.num_tokens  # the prefill worker's engine charged the prompt
        self.requests[req.request_id] = req
        self.waiting.join(req.tenant)
        self.running.append(req)
        return req

    def _check_new(self, ticket: Admitted) -> None:
        # Only an admission ticket enters a queue; a Rejection never does.
        if not isinstance(ticket, Admitted):
            raise TypeError(f"the scheduler only queues Admitted tickets, not {type(ticket).__name__}")
        if ticket.request_id in self.requests:
            raise ValueError(f"request id {ticket.request_id} is already live")

    def page_table(self, req: Request) -> list[int]:
        """Every page req reads, in position order: cached prefix, then its own."""
        return req.shared_pages + self.ledger.pages_of(req.request_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- planning --------------------------------------------------------------
    def schedule(self) -> StepPlan | None:
        preempted: list[str] = []
        flying = self.in_flight
        # A pass in flight with nobody else waiting runs on alone: its tenant's
        # decode rows ran beside its first slice (as beside a whole pass).
        quiet = flying is not None and not self.planner.contended(flying.work.tenant)
        decode = [] if quiet else self.planner.plan_decode(preempted)
        budget = self.config.token_budget - len(decode)
        prefills: list[PrefillWork] = []
        if self.in_flight is not None:  # its next slice first: its pages are held, it never waits
            prefills.append(self.in_flight.next_slice())
        prefills += self.planner.plan_prefills(budget, preempted)
        alive = lambda w: self.requests[w.request_id].status is RequestStatus.RUNNING  # noqa: E731
        decode = [w for w in decode if alive(w)]  # a later growth may have preempted it
        prefills = [w for w in prefills if alive(w)]
        if self.planner.first_tokens_first(prefills, decode):
            decode = []  # planned again next step: their pages are held, the growth is done
        self.planner.rounds.ran([w.request_id for w in decode])
        if not decode and not prefills and not preempted:
            return None
        return StepPlan(tuple(prefills), tuple(decode), tuple(preempted))

    def held_by_tenant(self, running: list[Request] | None = None) -> dict[str, int]:
        """Pages the running (preemptible) requests of each tenant own."""
        held: dict[str, int] = {}
        for r in self.running if running is None else running:
            held[r.tenant] = held.get(r.tenant, 0) + len(self.ledger.pages_of(r.request_id))
        return held

    def kv_quotas(self) -> dict[str, int]:
        """Each active tenant's page quota (meaningful when tenants compete)."""
        return quotas(self.ledger.num_pages, sorted(self.waiting.active), self.shares.weight, self.shares.kv_share)

    def tenant_stats(self) -> dict[str, dict]:
        """Per-tenant service, queue and pages, for /metrics and /server_info.
        Safe to call from another thread: it reads copies, never mutates."""
        counters, served, running = dict(self.waiting.counters), dict(self.waiting.served), list(self.running)
        held, active = self.held_by_tenant(running), sorted(self.waiting.active)
        quota = quotas(self.ledger.num_pages, active, self.shares.weight, self.shares.kv_share) if active else {}
        out = {}
        for t in sorted(set(counters) | set(held)):
            prompt, output = served.get(t, (0, 0))
            out[t] = {"service": round(counters.get(t, 0.0), 1), "prompt_tokens_served": prompt,
                      "output_tokens_served": output, "waiting": self.waiting.depth(t),
                      "running": sum(1 for r in running if r.tenant == t), "kv_pages": held.get(t, 0),
                      "kv_quota": quota.get(t), "quota_preemptions": self.quota_preemptions.get(t, 0)}
        return out

    def _retire(self, req: Request) -> None:
        """Full pages of computed prompt go to its tenant's prefix cache, the rest to be scrubbed."""
        rid = req.request_id
        self.pins.retire(req, self.ledger.pages_of(rid))
        if self.ledger.pages_of(rid):
            self.ledger.release(rid)

    def reserve_for_remote_kv(self, request_id: str, tenant: str, num_pages: int) -> list[int]:
        """Decode: pages a remote writer will fill for a request not yet
        scheduled (WAITING_FOR_REMOTE_KV). OutOfPages when the pool is short."""
        if request_id in self.requests or request_id in self.awaiting_remote_kv:
            raise ValueError(f"request id {request_id} is already live")
        pages = self.ledger.allocate(request_id, tenant, num_pages)
        self.awaiting_remote_kv[request_id] = tenant
        return pages

    def release_reserved(self, request_id: str) -> bool:
        """Give back (to be scrubbed) what a hand-over kept or a remote-KV
        reservation holds; False when the request holds neither."""
        if request_id in self.kept:
            self._retire(self.kept.pop(request_id))  # prompt pages may feed the prefix cache
            return True
        if self.awaiting_remote_kv.pop(request_id, None) is not None:
            self.ledger.release(request_id)
            return True
        return False

    # -- results -------------------------------------------------------------
    def complete(self, plan: StepPlan, sampled: dict[str, int]) -> list[Request]:
        """Record what a step computed; returns the requests that got a new token."""
        advanced = []
        for chunk in plan.prefills:
            if chunk.layers is not None:  # a slice: the pass goes on, or ends here
                if self.in_flight is None or self.in_flight.work.request_id != chunk.request_id:
                    continue  # its request ended during the step (finish() dropped the pass)
                if not self.in_flight.ran(chunk):
                    continue
                self.in_flight = None
            req = self.requests.get(chunk.request_id)
            if req is not None and req.status is RequestStatus.RUNNING:
                req.num_computed = chunk.end
                if chunk.samples:
                    advanced.append(req)
        for work in plan.decode:
            req = self.requests.get(work.request_id)
            if req is not None and req.status is RequestStatus.RUNNING:
                req.num_computed = work.position + 1
                advanced.append(req)
        for req in advanced:
            req.output_token_ids.append(sampled[req.request_id])
            if req.num_tokens > req.charged:  # a recomputed token was paid for the first time
                self.waiting.charge(req.tenant, output_tokens=1)
                req.charged = req.num_tokens
        return advanced

    def finish(self, request_id: str, reason: FinishReason, keep_pages: bool = False) -> Request | None:
        """End a request in any state; its pages go back to be scrubbed, unless
        keep_pages (a prefill worker holds them until their KV is transferred)."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        if self.in_flight is not None and self.in_flight.work.request_id == request_id:
            self.in_flight = None  # the engine drops the runner's paused rows with it
        if req.status is RequestStatus.RUNNING:
            if keep_pages:
                self.kept[request_id] = req
            else:
                self._retire(req)
            self.running.remove(req)
        elif req.status is RequestStatus.WAITING:
            self.waiting.remove(req)
        self.waiting.leave(req.tenant)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        return req

    def check_integrity(self) -> None:  # scheduler_integrity.py says what it checks
        check_scheduler(self)
