"""Continuous batching over the page ledger. Pure Python: no torch.

Each step carries one decode row for every request that is ready to decode
and prefill chunks of waiting or half-prefilled requests, up to a token
budget per step (chunked prefill as in vLLM): a short new prompt is
prefilled within a step or two instead of after every prompt ahead of it.
Which prompt goes next is fair across tenants (bulkhead.engine.fair_queue:
least service first), and while another tenant has work a long chunk's pass
is handed out a slice of layers per step (bulkhead.engine.pass_slices), so
that tenant's prompt and decode rows wait at most one slice. A request's chunks always start at multiples of
`prefill_chunk` from where its prefill started, whoever shares the step, so
its numbers do not depend on its batch-mates. When the pool runs out of
pages, a request is preempted (its pages released and scrubbed; it is
recomputed later), chosen by per-tenant KV quota (bulkhead.engine.kv_quota).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from bulkhead.engine.admission import Admitted
from bulkhead.engine.fair_queue import FairQueue
from bulkhead.engine.kv_quota import Preempt, quotas, victim_tenant
from bulkhead.engine.pass_slices import InFlightPass, layers_per_slice
from bulkhead.engine.request import FinishReason, Request, RequestStatus
from bulkhead.engine.scheduler_config import SchedulerConfig, TenantShares
from bulkhead.engine.step_plan import DecodeWork, PrefillWork, StepPlan
from bulkhead.engine.tenant_stats import tenant_stats
from bulkhead.kv.ledger import OutOfPages, PageLedger
from bulkhead.kv.prefix_cache import CACHE_OWNER, PrefixCache, page_hashes, tenant_salt


class QueueFull(RuntimeError):
    pass


class Scheduler:
    def __init__(self, config: SchedulerConfig, ledger: PageLedger, reclaim: Callable[[], None],
                 cache_secret: bytes = b"", shares: TenantShares | None = None):
        """reclaim() must scrub every dirty page and mark it scrubbed (the engine
        owns the pool tensor; the scheduler never touches KV bytes).
        cache_secret: server-side key that tenant cache salts derive from.
        shares: tenant weights and KV shares; replace it (a reloaded tenant
        table) between steps, on the engine thread."""
        self.config = config
        self.ledger = ledger
        self.reclaim = reclaim
        self.shares = shares or TenantShares()
        self.cache = PrefixCache(ledger) if config.prefix_cache else None
        self._cache_secret = cache_secret
        # The two states whose pages live outside the batch, both for a KV
        # transfer, both covered by check_integrity(): a prefill hand-over's
        # finished request, kept until its pages are sent (release_reserved),
        # and decode's WAITING_FOR_REMOTE_KV reservation, request id ->
        # tenant, until the verified KV starts decoding (add_prefilled) or
        # the request ends (release_reserved).
        self.kept: dict[str, Request] = {}
        self.awaiting_remote_kv: dict[str, str] = {}
        self.requests: dict[str, Request] = {}
        self.waiting = FairQueue(lambda t: self.shares.weight(t), config.prompt_token_cost,
                                 config.output_token_cost, fair=config.fair)
        self.running: list[Request] = []
        # The one chunk whose pass runs a slice of layers per step (pass_slices.py), if any.
        self.in_flight: InFlightPass | None = None
        self.num_preemptions = 0
        # Requests of a tenant preempted to give its pages to another tenant.
        self.quota_preemptions: dict[str, int] = {}
        self._arrivals = itertools.count()  # strict order; clocks can tie

    # -- intake --------------------------------------------------------------
    def add(self, ticket: Admitted) -> Request:
        # Only an admission ticket enters a queue; a Rejection never does.
        if not isinstance(ticket, Admitted):
            raise TypeError(f"the scheduler only queues Admitted tickets, not {type(ticket).__name__}")
        if ticket.request_id in self.requests:
            raise ValueError(f"request id {ticket.request_id} is already live")
        if len(self.waiting) >= self.config.max_waiting:
            raise QueueFull(f"{len(self.waiting)} requests already waiting")
        req = Request(ticket.request_id, ticket.tenant, list(ticket.prompt_token_ids), ticket.params,
                      next(self._arrivals), adapter=ticket.adapter.digest if ticket.adapter else None)
        if self.cache is not None:
            # Never the whole prompt: its last token must be computed for logits.
            salt = tenant_salt(self._cache_secret, ticket.tenant, ticket.cache_salt, req.adapter)
            req.prefix_hashes = page_hashes(salt, req.prompt_token_ids, self.config.page_size,
                                            max_pages=(len(req.prompt_token_ids) - 1) // self.config.page_size)
        self.requests[req.request_id] = req
        self.waiting.join(req.tenant)
        self.waiting.append(req)
        return req

    def add_prefilled(self, ticket: Admitted, first_token: int) -> Request:
        """A request whose prompt KV already sits in pages it owns (written by
        a prefill worker and verified): it joins the batch ready to decode."""
        if not isinstance(ticket, Admitted):
            raise TypeError(f"the scheduler only queues Admitted tickets, not {type(ticket).__name__}")
        if ticket.request_id in self.requests:
            raise ValueError(f"request id {ticket.request_id} is already live")
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
        quiet = flying is not None and not self._contended(flying.work.tenant)
        decode = [] if quiet else self._plan_decode(preempted)
        budget = self.config.token_budget - len(decode)
        prefills: list[PrefillWork] = []
        if self.in_flight is not None:  # its next slice first: its pages are held, it never waits
            prefills.append(self.in_flight.next_slice())
        prefills += self._plan_prefills(budget, preempted)
        alive = lambda w: self.requests[w.request_id].status is RequestStatus.RUNNING  # noqa: E731
        decode = [w for w in decode if alive(w)]  # a later growth may have preempted it
        prefills = [w for w in prefills if alive(w)]
        if not decode and not prefills and not preempted:
            return None
        return StepPlan(tuple(prefills), tuple(decode), tuple(preempted))

    def _contended(self, tenant: str) -> bool:
        """Another tenant has a request here: a whole pass of tenant's would make it wait."""
        return self.config.fair and any(r.tenant != tenant for r in self.requests.values())

    def _sliced(self, work: PrefillWork) -> PrefillWork:
        """work, or its pass's first slice: when it is longer than a slice and
        another tenant waits, or longer than whole_pass_tokens whoever waits
        (a prompt that arrives while it runs then waits one slice, not the
        pass, though nobody waited when it was planned)."""
        cfg = self.config
        per = layers_per_slice(cfg.num_layers, len(work.token_ids), cfg.slice_tokens)
        long = len(work.token_ids) > cfg.whole_pass_tokens
        if per >= cfg.num_layers or self.in_flight is not None or not cfg.fair \
                or not (long or self._contended(work.tenant)):
            return work
        self.in_flight = InFlightPass(work, per, cfg.num_layers)
        return self.in_flight.next_slice()

    def _prefill_candidates(self, exclude: set[str]) -> list[tuple[Request, bool]]:
        """(request, is running) per tenant: its oldest half-prefilled request,
        else (while the batch has room) the head of its waiting line. First
        come, first served (fair=False): the oldest half-prefilled request,
        else the oldest waiting one."""
        if not self.config.fair:
            started = [r for r in self.running if r.num_computed < r.prefill_target and r.request_id not in exclude]
            if started:
                return [(min(started, key=lambda r: r.arrival), True)]
            if len(self.running) < self.config.max_running:
                return [(r, False) for r in self.waiting if r.request_id not in exclude][:1]
            return []
        partial: dict[str, Request] = {}
        for r in self.running:
            if r.num_computed < r.prefill_target and r.request_id not in exclude:
                if r.tenant not in partial or r.arrival < partial[r.tenant].arrival:
                    partial[r.tenant] = r
        out = [(r, True) for r in partial.values()]
        if len(self.running) < self.config.max_running:
            out += [(r, False) for r in self.waiting.heads() if r.tenant not in partial and r.request_id not in exclude]
        return out

    def _plan_prefills(self, budget: int, preempted: list[str]) -> list[PrefillWork]:
        """Chunks in fair order within budget (the first always, when no pass
        is in flight). While one is, only chunks that run whole in a slice's
        time join it: a step stays about one slice long."""
        works: list[PrefillWork] = []
        exclude: set[str] = set()
        if self.in_flight is not None:
            exclude.add(self.in_flight.work.request_id)
            budget = min(budget, self.config.slice_tokens)
        while True:
            exclude.update(preempted)  # never re-admitted in the step that preempted it
            candidates = self._prefill_candidates(exclude)
            if not candidates:
                return works
            req, running = min(candidates, key=lambda c: self.waiting.rank(*c, self._next_chunk_tokens(c[0])))
            exclude.add(req.request_id)
            first = not works and self.in_flight is None
            work = self._plan_chunk(req, running, None if first else budget, preempted)
            if work is None and not self.config.fair:
                return works  # first come, first served: nobody overtakes the head of the line
            if work is not None:
                works.append(self._sliced(work))
                budget -= len(work.token_ids)
                if self.in_flight is not None:
                    budget = min(budget, self.config.slice_tokens)

    def _next_chunk_tokens(self, req: Request) -> int:
        """Prompt tokens req's next chunk computes (before any prefix-cache hit)."""
        return min(req.prefill_target - req.num_computed, self.config.prefill_chunk)

    def _plan_chunk(self, req: Request, running: bool, budget: int | None,
                    preempted: list[str]) -> PrefillWork | None:
        """The next chunk of req, if it fits the budget (None: no limit) and
        its pages can be had (preempting as kv_quota's table allows)."""
        wants_prompt_logprobs = req.params.prompt_logprobs is not None
        if not running and self.cache is not None and req.num_computed == 0 and not wants_prompt_logprobs:
            req.shared_pages = self.cache.lookup(req.tenant, req.prefix_hashes, req.request_id)
            req.num_computed = len(req.shared_pages) * self.config.page_size
        end = min(req.prefill_target, req.num_computed + self.config.prefill_chunk)
        if (budget is not None and end - req.num_computed > budget) or end == req.num_computed:
            if not running:
                self._drop_shared(req)
            return None
        if not running:
            room = self._has_room_for(req, end)
            if not self._grow(req, end, preempted, Preempt.NOBODY if room else Preempt.OTHERS_OVER_QUOTA):
                self._drop_shared(req)
                return None
            self.waiting.remove(req)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
        elif not self._grow(req, end, preempted, Preempt.ANY):
            return None
        fresh = end - max(req.num_computed, req.charged)
        if fresh > 0:
            self.waiting.charge(req.tenant, prompt_tokens=fresh)
        req.charged = max(req.charged, end)
        tokens = tuple(req.token_at(i) for i in range(req.num_computed, end))
        return PrefillWork(req.request_id, req.tenant, req.num_computed, tokens, tuple(self.page_table(req)),
                           samples=end == req.num_tokens,
                           # once: a recompute after a preemption has sent its prompt logprobs already
                           all_logits=wants_prompt_logprobs and not req.output_token_ids
                           and req.num_computed < len(req.prompt_token_ids), adapter=req.adapter)

    def _plan_decode(self, preempted: list[str]) -> list[DecodeWork]:
        work = []
        for req in sorted((r for r in self.running if r.decoding), key=lambda r: r.arrival):
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted while making room for an older request
            if not self._grow(req, req.num_computed + 1, preempted, Preempt.ANY):
                continue
            work.append(DecodeWork(req.request_id, req.tenant, req.num_computed, req.token_at(req.num_computed),
                                   tuple(self.page_table(req)), req.adapter))
        return work

    def _has_room_for(self, req: Request, tokens: int) -> bool:
        # Keep one page of headroom per running request so that admitting a
        # new one does not immediately force a preemption.
        need = -(-tokens // self.config.page_size) - len(req.shared_pages) + len(self.running)
        evictable = self.cache.num_evictable if self.cache is not None else 0
        return self.ledger.num_free + self.ledger.num_dirty + evictable >= need

    def _grow(self, req: Request, tokens: int, preempted: list[str], policy: Preempt) -> bool:
        """Make req hold pages for `tokens` positions, preempting as policy allows."""
        held = len(self.page_table(req))
        need = -(-tokens // self.config.page_size) - held
        while need > 0:
            try:
                self.ledger.allocate(req.request_id, req.tenant, need)
                return True
            except OutOfPages:
                if self.ledger.num_dirty:
                    self.reclaim()
                    continue
                if self.cache is not None and self.cache.evict(need):
                    continue
                victim = None if policy is Preempt.NOBODY else self._victim(req, need, policy is Preempt.ANY)
                if victim is None:
                    return False
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim.tenant != req.tenant:
                    self.quota_preemptions[victim.tenant] = self.quota_preemptions.get(victim.tenant, 0) + 1
                if victim is req:
                    return False
        return True

    def held_by_tenant(self) -> dict[str, int]:
        """Pages the running (preemptible) requests of each tenant own."""
        held: dict[str, int] = {}
        for r in self.running:
            held[r.tenant] = held.get(r.tenant, 0) + len(self.ledger.pages_of(r.request_id))
        return held

    def kv_quotas(self) -> dict[str, int]:
        """Each active tenant's page quota (meaningful when tenants compete)."""
        return quotas(self.ledger.num_pages, sorted(self.waiting.active), self.shares.weight, self.shares.kv_share)

    def tenant_stats(self) -> dict[str, dict]:
        """Per-tenant service, queue and pages, for /metrics and /server_info
        (bulkhead.engine.tenant_stats). Safe from another thread."""
        return tenant_stats(self)

    def _victim(self, req: Request, need: int, may_take_own: bool) -> Request | None:
        """Whom to preempt for req's pages; never a request whose pass is in
        flight (its paused rows are computed over the pages it holds)."""
        flying = self.in_flight.work.request_id if self.in_flight is not None else None
        preemptible = [r for r in self.running if r.request_id != flying]
        if not self.config.kv_quotas:
            return max(preemptible, key=lambda r: r.arrival) if may_take_own and preemptible else None
        tenant = victim_tenant(self.held_by_tenant(), self.kv_quotas(), req.tenant, need, may_take_own)
        pool = [r for r in preemptible if r.tenant == tenant]
        return max(pool, key=lambda r: r.arrival) if pool else None

    def _drop_shared(self, req: Request) -> None:
        if self.cache is not None and req.shared_pages:
            self.cache.unpin(req.shared_pages)
        req.shared_pages = []
        req.num_computed = 0

    def _retire(self, req: Request) -> None:
        """Give back a finished request's pages: full pages of computed prompt
        go to its tenant's prefix cache, the rest are released to be scrubbed."""
        rid = req.request_id
        if self.cache is not None:
            own = self.ledger.pages_of(rid)
            first = len(req.shared_pages)
            computed_pages = min(len(req.prefix_hashes), req.num_computed // self.config.page_size)
            if computed_pages > first:
                self.cache.insert(rid, req.tenant, req.prefix_hashes[first:computed_pages],
                                  own[: computed_pages - first])
            self.cache.unpin(req.shared_pages)
            req.shared_pages = []
        if self.ledger.pages_of(rid):
            self.ledger.release(rid)

    def release_kept(self, request_id: str) -> None:
        req = self.kept.pop(request_id)
        self._retire(req)

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
            self.release_kept(request_id)  # prompt pages may feed the prefix cache
            return True
        if self.awaiting_remote_kv.pop(request_id, None) is not None:
            self.ledger.release(request_id)
            return True
        return False

    def _preempt(self, req: Request) -> None:
        if self.ledger.pages_of(req.request_id):
            self.ledger.release(req.request_id)
        self._drop_shared(req)
        self.running.remove(req)
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

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
        """End a request in any state; its pages (if any) go back to be scrubbed,
        unless keep_pages: then they stay owned by the request id (a prefill
        worker holds them until their KV has been transferred)."""
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

    def check_integrity(self) -> None:
        running = {r.request_id for r in self.running}
        waiting = {r.request_id for r in self.waiting}
        if running & waiting:
            raise AssertionError(f"requests both running and waiting: {running & waiting}")
        if running | waiting != set(self.requests):
            raise AssertionError("scheduler queues disagree with its request table")
        for r in self.waiting:
            if self.ledger.pages_of(r.request_id) or r.shared_pages:
                raise AssertionError(f"waiting request {r.request_id} holds pages")
        for r in self.running:
            held = len(self.page_table(r)) * self.config.page_size
            if held < r.num_computed:
                raise AssertionError(f"request {r.request_id} computed {r.num_computed} tokens in {held} slots")
        if self.in_flight is not None:
            work = self.in_flight.work
            req = self.requests.get(work.request_id)
            if req is None or req.status is not RequestStatus.RUNNING or req.num_computed != work.start:
                raise AssertionError(f"pass in flight for {work.request_id}, which is not running at {work.start}")
            if tuple(self.page_table(req))[: len(work.pages)] != work.pages:
                raise AssertionError(f"{work.request_id}'s pages moved while its pass was in flight")
        if set(self.awaiting_remote_kv) & (set(self.requests) | set(self.kept)):
            raise AssertionError("a request awaits remote KV and is scheduled or kept")
        live = running | set(self.awaiting_remote_kv) | set(self.kept)
        if self.cache is not None:
            live.add(CACHE_OWNER)
            self.cache.check_integrity()
            pinned: dict[int, int] = {}
            for r in [*self.running, *self.kept.values()]:
                for p in r.shared_pages:
                    pinned[p] = pinned.get(p, 0) + 1
            if pinned != self.cache.pins:
                raise AssertionError(f"cache pins {self.cache.pins} != pages requests read {pinned}")
        self.ledger.check_integrity(live_requests=live)
        self._check_quota_accounting()

    def _check_quota_accounting(self) -> None:
        """The per-tenant counts quotas are decided on: every owned page is
        counted once, for the tenant of the request (or cache entry) holding
        it; the fair queue counts exactly the live requests; quotas never
        promise more than the pool."""
        live: dict[str, int] = {}
        for r in self.requests.values():
            live[r.tenant] = live.get(r.tenant, 0) + 1
        self.waiting.check_integrity(live)
        counted = self.held_by_tenant()
        for r in self.kept.values():
            counted[r.tenant] = counted.get(r.tenant, 0) + len(self.ledger.pages_of(r.request_id))
        for rid in self.awaiting_remote_kv:
            for p in self.ledger.pages_of(rid):
                t = self.ledger.record(p).tenant
                counted[t] = counted.get(t, 0) + 1
        for p in self.ledger.pages_of(CACHE_OWNER):
            t = self.ledger.record(p).tenant
            counted[t] = counted.get(t, 0) + 1
        counted = {t: n for t, n in counted.items() if n}
        if counted != self.ledger.owned_by_tenant():
            raise AssertionError(f"pages counted per tenant {counted} != ledger {self.ledger.owned_by_tenant()}")
        if sum(self.kv_quotas().values()) > self.ledger.num_pages:
            raise AssertionError(f"quotas {self.kv_quotas()} exceed the pool of {self.ledger.num_pages} pages")
