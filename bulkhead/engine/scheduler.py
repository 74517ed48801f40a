"""Continuous batching over the page ledger. Pure Python: no torch.

Each step carries one decode row for every request that is ready to decode
and prefill chunks of waiting or half-prefilled requests, up to a token
budget per step (chunked prefill as in vLLM): a short new prompt is
prefilled within a step or two instead of after every prompt ahead of it.
Which prompt goes next is fair across tenants (bulkhead.engine.fair_queue:
least service first), and a less-served tenant's chunk or decode rows may
run inside another tenant's long prefill pass (plan_interjection,
plan_decode_between; the engine runs them between layers). A request's chunks always start at multiples of
`prefill_chunk` from where its prefill started, whoever shares the step, so
its numbers do not depend on its batch-mates. When the pool runs out of
pages, a request is preempted (its pages released and scrubbed; it is
recomputed later), chosen by per-tenant KV quota (bulkhead.engine.kv_quota).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from bulkhead.engine.admission import Admitted
from bulkhead.engine.fair_queue import FairQueue
from bulkhead.engine.kv_quota import quotas, victim_tenant
from bulkhead.engine.request import FinishReason, Request, RequestStatus
from bulkhead.kv.ledger import OutOfPages, PageLedger
from bulkhead.kv.prefix_cache import CACHE_OWNER, PrefixCache, page_hashes, tenant_salt


@dataclass(frozen=True)
class SchedulerConfig:
    page_size: int
    # Requests holding pages at once: the largest decode batch.
    max_running: int = 32
    # Prompt tokens per prefill pass of one request; bounds how long one
    # prompt's pass delays everything else in its step.
    prefill_chunk: int = 512
    # Tokens (decode rows + prefill chunk tokens) one step may carry; 0 = one
    # full chunk beside a full decode batch. A step always carries at least
    # one chunk when a prompt waits, so prefill never starves.
    step_tokens: int = 0
    # Admitted requests waiting for pages; beyond it new ones get a 503.
    max_waiting: int = 1024
    # Reuse whole pages of a tenant's earlier prompts (tenant-scoped keys).
    prefix_cache: bool = False
    # Fair queueing across tenants (VTC); False = first come, first served,
    # kept only to measure what fairness costs.
    fair: bool = True
    # Virtual-counter cost of a prompt token and of an output token (the
    # VTC paper's 1 and 2: an output token holds the batch for a whole step).
    prompt_token_cost: float = 1.0
    output_token_cost: float = 2.0
    # Per-tenant KV quotas when tenants compete for pages (kv_quota.py);
    # False = the newest request is preempted, whoever's it is.
    kv_quotas: bool = True

    def __post_init__(self) -> None:
        for name in ("page_size", "max_running", "prefill_chunk", "max_waiting"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.step_tokens < 0:
            raise ValueError(f"step_tokens must be >= 0, got {self.step_tokens}")
        if self.prompt_token_cost < 0 or self.output_token_cost < 0:
            raise ValueError("token costs must be >= 0")

    @property
    def token_budget(self) -> int:
        return self.step_tokens or self.prefill_chunk + self.max_running


@dataclass(frozen=True)
class TenantShares:
    """What the scheduler reads about a tenant (from the tenant table):
    weight(t) > 0 for fair service, kv_share(t) a pool fraction or None for
    the fair share of active tenants."""

    weight: Callable[[str], float] = lambda _t: 1.0
    kv_share: Callable[[str], float | None] = lambda _t: None


@dataclass(frozen=True)
class PrefillWork:
    request_id: str
    tenant: str
    start: int  # first position computed in this pass
    token_ids: tuple[int, ...]  # tokens at positions [start, start + len)
    pages: tuple[int, ...]  # every page the request owns, in position order
    samples: bool  # the chunk ends the sequence: sample the next token
    all_logits: bool = False  # logits for every row, not only the sampling one (prompt logprobs)

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)


@dataclass(frozen=True)
class DecodeWork:
    request_id: str
    tenant: str
    position: int
    token_id: int
    pages: tuple[int, ...]


@dataclass(frozen=True)
class StepPlan:
    """What one engine step computes: only ids and ints, for the model runner.

    prefills: one pass per chunk (a single PrefillWork or None is accepted
    and made a tuple, for callers that plan one chunk by hand)."""

    prefills: tuple[PrefillWork, ...]
    decode: tuple[DecodeWork, ...]
    preempted: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.prefills is None:
            object.__setattr__(self, "prefills", ())
        elif isinstance(self.prefills, PrefillWork):
            object.__setattr__(self, "prefills", (self.prefills,))

    @property
    def request_ids(self) -> list[str]:
        return [w.request_id for w in self.prefills] + [w.request_id for w in self.decode]

    @property
    def num_tokens(self) -> int:
        return sum(len(w.token_ids) for w in self.prefills) + len(self.decode)


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
                      next(self._arrivals))
        if self.cache is not None:
            # Never the whole prompt: its last token must be computed for logits.
            salt = tenant_salt(self._cache_secret, ticket.tenant, ticket.cache_salt)
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
                      num_computed=len(ticket.prompt_token_ids), status=RequestStatus.RUNNING)
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
        decode = self._plan_decode(preempted)
        prefills = self._plan_prefills(self.config.token_budget - len(decode), preempted)
        alive = lambda w: self.requests[w.request_id].status is RequestStatus.RUNNING  # noqa: E731
        decode = [w for w in decode if alive(w)]  # a later growth may have preempted it
        prefills = [w for w in prefills if alive(w)]
        if not decode and not prefills and not preempted:
            return None
        return StepPlan(tuple(prefills), tuple(decode), tuple(preempted))

    def _interjection_bar(self, busy: StepPlan) -> float:
        """The most service a tenant may have *after* what it would run inside
        busy's paused pass (its virtual finish tag): the least served busy
        tenant's counter plus one full chunk's cost, where that tenant's next
        chunk would finish. Compared without the chunk, a light tenant whose
        last short prompt ran inside this same long pass is a few tokens
        ahead of the flood (charged a chunk at a time) and its next prompt
        waited out the pass. Compared by counters alone, with the chunk as
        slack, another flooding tenant's whole chunk fit, and ran inside the
        pass where nothing can interject (one heavy tenant's 1.9 s chunk inside
        another's, the light prompt waiting behind both: measured with four
        heavy tenants). Finish tags (strictly below it) let the short prompt
        in and keep a flood level with busy's out, and no tenant gets more
        than a chunk ahead."""
        counters = self.waiting.counters
        return (min(counters.get(w.tenant, 0.0) for w in busy.prefills)
                + self.config.prefill_chunk * self.config.prompt_token_cost)

    def plan_interjection(self, busy: StepPlan) -> StepPlan | None:
        """One prefill chunk to run while `busy`'s long prefill pass is paused
        between two layers (interjection: bulkhead.engine.engine), or None:
        the next chunk of the least-served tenant that is waiting, when that
        tenant has nothing in busy and has had no more service than the least
        served tenant busy prefills, give or take a chunk (_interjection_bar).
        Only a prompt's last chunk (the one that yields its first token): a
        flooding tenant's first chunk of a long prompt waits for the next
        step, since nothing can interject inside an interjected pass (with
        four heavy tenants, one's 1.4 s chunk ran inside another's while the
        light prompt waited behind both). Fair order only. Never preempts and
        takes no page busy holds: busy's
        passes resume where they stopped, on the same pages. No decode rows
        (plan_decode_between plans those)."""
        if not self.config.fair or not busy.prefills:
            return None
        counters = self.waiting.counters
        busy_tenants = {w.tenant for w in busy.prefills} | {w.tenant for w in busy.decode}
        bar = self._interjection_bar(busy)
        finish = lambda c: self.waiting.rank(*c, self._next_chunk_tokens(c[0]))  # noqa: E731
        last_chunk = lambda r: self._next_chunk_tokens(r) == r.prefill_target - r.num_computed  # noqa: E731
        candidates = [c for c in self._prefill_candidates(set(busy.request_ids))
                      if c[0].tenant not in busy_tenants and last_chunk(c[0]) and finish(c)[0] < bar]
        if not candidates:
            return None
        req, running = min(candidates, key=finish)
        work = self._plan_chunk(req, running, None, [], may_preempt=False)
        return StepPlan((work,), (), ()) if work is not None else None

    def plan_decode_between(self, busy: StepPlan) -> StepPlan | None:
        """Decode rows to run while `busy`'s long prefill pass is paused between
        two layers, or None. Only when a tenant that busy does not prefill
        for, with no more service than the least served tenant busy prefills
        (give or take a chunk: _interjection_bar), has a request decoding (its
        next token need not wait out a better-served tenant's pass); then
        every decoding request busy does not hold gets a
        row, the busy tenants' too: on this CPU a decode pass costs about the
        same for 1 row as for 16 (it reads the weights once), so the extra rows
        are nearly free tokens. Fair order only. Never preempts (a row whose
        page cannot be had waits for the next step)."""
        if not self.config.fair or not busy.prefills:
            return None
        counters, q = self.waiting.counters, self.waiting
        bar = self._interjection_bar(busy)
        busy_ids, busy_tenants = set(busy.request_ids), {w.tenant for w in busy.prefills}
        decoding = [r for r in self.running if r.decoding and r.request_id not in busy_ids]
        after_a_token = lambda t: counters.get(t, 0.0) + q.output_cost / q.weight_of(t)  # noqa: E731
        if not any(r.tenant not in busy_tenants and after_a_token(r.tenant) <= bar for r in decoding):
            return None
        work = []
        for req in sorted(decoding, key=lambda r: r.arrival):
            if self._grow(req, req.num_computed + 1, [], "none"):
                work.append(DecodeWork(req.request_id, req.tenant, req.num_computed,
                                       req.token_at(req.num_computed), tuple(self.page_table(req))))
        return StepPlan((), tuple(work), ()) if work else None

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
        works: list[PrefillWork] = []
        exclude: set[str] = set()
        while True:
            exclude.update(preempted)  # never re-admitted in the step that preempted it
            candidates = self._prefill_candidates(exclude)
            if not candidates:
                return works
            req, running = min(candidates, key=lambda c: self.waiting.rank(*c, self._next_chunk_tokens(c[0])))
            exclude.add(req.request_id)
            work = self._plan_chunk(req, running, budget if works else None, preempted)
            if work is None and not self.config.fair:
                return works  # first come, first served: nobody overtakes the head of the line
            if work is not None:
                works.append(work)
                budget -= len(work.token_ids)

    def _next_chunk_tokens(self, req: Request) -> int:
        """Prompt tokens req's next chunk computes (before any prefix-cache hit)."""
        return min(req.prefill_target - req.num_computed, self.config.prefill_chunk)

    def _plan_chunk(self, req: Request, running: bool, budget: int | None,
                    preempted: list[str], may_preempt: bool = True) -> PrefillWork | None:
        """The next chunk of req, if it fits the budget (None: no limit) and
        its pages can be had (without preempting anyone, unless may_preempt)."""
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
            if not (room or may_preempt) or not self._grow(req, end, preempted, "none" if room else "others"):
                self._drop_shared(req)
                return None
            self.waiting.remove(req)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
        elif not self._grow(req, end, preempted, "any" if may_preempt else "none"):
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
                           and req.num_computed < len(req.prompt_token_ids))

    def _plan_decode(self, preempted: list[str]) -> list[DecodeWork]:
        work = []
        for req in sorted((r for r in self.running if r.decoding), key=lambda r: r.arrival):
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted while making room for an older request
            if not self._grow(req, req.num_computed + 1, preempted, "any"):
                continue
            work.append(DecodeWork(req.request_id, req.tenant, req.num_computed, req.token_at(req.num_computed),
                                   tuple(self.page_table(req))))
        return work

    def _has_room_for(self, req: Request, tokens: int) -> bool:
        # Keep one page of headroom per running request so that admitting a
        # new one does not immediately force a preemption.
        need = -(-tokens // self.config.page_size) - len(req.shared_pages) + len(self.running)
        evictable = self.cache.num_evictable if self.cache is not None else 0
        return self.ledger.num_free + self.ledger.num_dirty + evictable >= need

    def _grow(self, req: Request, tokens: int, preempted: list[str], mode: str) -> bool:
        """Make req hold pages for `tokens` positions. mode: "any" may preempt
        (kv_quota's table says whom), "others" only another tenant's request
        over its quota, "none" nobody."""
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
                victim = None if mode == "none" else self._victim(req, need, may_take_own=mode == "any")
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
        """Per-tenant service, queue and pages, for /metrics and /server_info.
        Safe to call from another thread: it reads copies, never mutates."""
        counters, served = dict(self.waiting.counters), dict(self.waiting.served)
        running = list(self.running)
        held: dict[str, int] = {}
        for r in running:
            held[r.tenant] = held.get(r.tenant, 0) + len(self.ledger.pages_of(r.request_id))
        active = list(self.waiting.active)
        quota = quotas(self.ledger.num_pages, sorted(active), self.shares.weight, self.shares.kv_share) \
            if active else {}
        out = {}
        for t in sorted(set(counters) | set(held)):
            prompt, output = served.get(t, (0, 0))
            out[t] = {"service": round(counters.get(t, 0.0), 1), "prompt_tokens_served": prompt,
                      "output_tokens_served": output, "waiting": self.waiting.depth(t),
                      "running": sum(1 for r in running if r.tenant == t), "kv_pages": held.get(t, 0),
                      "kv_quota": quota.get(t), "quota_preemptions": self.quota_preemptions.get(t, 0)}
        return out

    def _victim(self, req: Request, need: int, may_take_own: bool) -> Request | None:
        if not self.config.kv_quotas:
            return max(self.running, key=lambda r: r.arrival) if may_take_own and self.running else None
        tenant = victim_tenant(self.held_by_tenant(), self.kv_quotas(), req.tenant, need, may_take_own)
        pool = [r for r in self.running if r.tenant == tenant]
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
