"""Continuous batching over the page ledger. Pure Python: no torch.

Each step is either one prefill chunk of one request or one decode step of
every request that is ready to decode. Prefill goes first (short time to
first token) but never more than `max_prefill_streak` chunks in a row while
decoders wait. When the pool runs out of pages, the newest running request is
preempted: its pages are released (and scrubbed) and it is recomputed later.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from bulkhead.engine.admission import Admitted
from bulkhead.engine.request import FinishReason, Request, RequestStatus
from bulkhead.kv.ledger import OutOfPages, PageLedger
from bulkhead.kv.prefix_cache import CACHE_OWNER, PrefixCache, page_hashes, tenant_salt


@dataclass(frozen=True)
class SchedulerConfig:
    page_size: int
    # Requests holding pages at once: the largest decode batch.
    max_running: int = 32
    # Prompt tokens per prefill pass; bounds how long decoders can stall.
    prefill_chunk: int = 512
    # Prefill passes in a row before waiting decoders get a step.
    max_prefill_streak: int = 4
    # Admitted requests waiting for pages; beyond it new ones get a 503.
    max_waiting: int = 1024
    # Reuse whole pages of a tenant's earlier prompts (tenant-scoped keys).
    prefix_cache: bool = False

    def __post_init__(self) -> None:
        for name in ("page_size", "max_running", "prefill_chunk", "max_prefill_streak", "max_waiting"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True)
class PrefillWork:
    request_id: str
    tenant: str
    start: int  # first position computed in this pass
    token_ids: tuple[int, ...]  # tokens at positions [start, start + len)
    pages: tuple[int, ...]  # every page the request owns, in position order
    samples: bool  # the chunk ends the sequence: sample the next token

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
    """What one engine step computes: only ids and ints, for the model runner."""

    prefill: PrefillWork | None
    decode: tuple[DecodeWork, ...]
    preempted: tuple[str, ...]


class QueueFull(RuntimeError):
    pass


class Scheduler:
    def __init__(self, config: SchedulerConfig, ledger: PageLedger, reclaim: Callable[[], None],
                 cache_secret: bytes = b""):
        """reclaim() must scrub every dirty page and mark it scrubbed (the engine
        owns the pool tensor; the scheduler never touches KV bytes).
        cache_secret: server-side key that tenant cache salts derive from."""
        self.config = config
        self.ledger = ledger
        self.reclaim = reclaim
        self.cache = PrefixCache(ledger) if config.prefix_cache else None
        self._cache_secret = cache_secret
        # Finished requests whose pages stay (prefill hand-over) until release_kept.
        self.kept: dict[str, Request] = {}
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._prefill_streak = 0
        self.num_preemptions = 0
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
        req = Request(ticket.request_id, ticket.tenant, list(ticket.prompt_token_ids), ticket.params,
                      next(self._arrivals), output_token_ids=[first_token],
                      num_computed=len(ticket.prompt_token_ids), status=RequestStatus.RUNNING)
        self.requests[req.request_id] = req
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
        decoders = [r for r in self.running if r.decoding]
        if not decoders or self._prefill_streak < self.config.max_prefill_streak:
            work = self._plan_prefill(preempted)
            if work is not None:
                self._prefill_streak += 1
                return StepPlan(work, (), tuple(preempted))
        self._prefill_streak = 0
        decode = self._plan_decode(preempted)
        if not decode and not preempted:
            return None
        return StepPlan(None, tuple(decode), tuple(preempted))

    def _plan_prefill(self, preempted: list[str]) -> PrefillWork | None:
        req = next((r for r in self.running if r.num_computed < r.prefill_target), None)
        if req is None:
            if not self.waiting or len(self.running) >= self.config.max_running:
                return None
            req = self.waiting[0]
        if req.status is RequestStatus.WAITING and self.cache is not None and req.num_computed == 0:
            req.shared_pages = self.cache.lookup(req.tenant, req.prefix_hashes)
            req.num_computed = len(req.shared_pages) * self.config.page_size
        end = min(req.prefill_target, req.num_computed + self.config.prefill_chunk)
        if req.status is RequestStatus.WAITING and not self._has_room_for(req, end):
            self._drop_shared(req)
            return None
        if not self._grow(req, end, preempted, may_preempt=req.status is RequestStatus.RUNNING):
            if req.status is RequestStatus.WAITING:
                self._drop_shared(req)
            return None
        if req.status is RequestStatus.WAITING:
            if end == req.num_computed:
                return None  # nothing to prefill (cannot happen for admitted tickets)
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
        tokens = tuple(req.token_at(i) for i in range(req.num_computed, end))
        return PrefillWork(req.request_id, req.tenant, req.num_computed, tokens, tuple(self.page_table(req)),
                           samples=end == req.num_tokens)

    def _plan_decode(self, preempted: list[str]) -> list[DecodeWork]:
        work = []
        for req in sorted((r for r in self.running if r.decoding), key=lambda r: r.arrival):
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted while making room for an older request
            if not self._grow(req, req.num_computed + 1, preempted, may_preempt=True):
                continue
            work.append(DecodeWork(req.request_id, req.tenant, req.num_computed, req.token_at(req.num_computed),
                                   tuple(self.page_table(req))))
        return [w for w in work if self.requests[w.request_id].status is RequestStatus.RUNNING]

    def _has_room_for(self, req: Request, tokens: int) -> bool:
        # Keep one page of headroom per running request so that admitting a
        # new one does not immediately force a preemption.
        need = -(-tokens // self.config.page_size) - len(req.shared_pages) + len(self.running)
        evictable = self.cache.num_evictable if self.cache is not None else 0
        return self.ledger.num_free + self.ledger.num_dirty + evictable >= need

    def _grow(self, req: Request, tokens: int, preempted: list[str], may_preempt: bool) -> bool:
        """Make req hold pages for `tokens` positions, preempting the newest others if allowed."""
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
                if not may_preempt:
                    return False
                victim = max(self.running, key=lambda r: r.arrival)
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    return False
        return True

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
        if plan.prefill is not None:
            req = self.requests.get(plan.prefill.request_id)
            if req is not None and req.status is RequestStatus.RUNNING:
                req.num_computed = plan.prefill.end
                if plan.prefill.samples:
                    req.output_token_ids.append(sampled[req.request_id])
                    advanced.append(req)
        for work in plan.decode:
            req = self.requests.get(work.request_id)
            if req is not None and req.status is RequestStatus.RUNNING:
                req.num_computed = work.position + 1
                req.output_token_ids.append(sampled[req.request_id])
                advanced.append(req)
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
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        return req

    def check_integrity(self, reserved: set[str] = frozenset()) -> None:
        """reserved: ids that own pages outside the scheduler (held for or
        awaiting a KV transfer)."""
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
        live = running | set(reserved) | set(self.kept)
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
