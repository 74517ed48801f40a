"""Chunk planning: what one step computes. Pure Python.

A step carries a decode row for every request ready to decode (in rounds:
decode_rounds.py) and prefill chunks up to a token budget (chunked prefill,
as vLLM's), so a short new prompt is prefilled within a step or two, not
after every prompt ahead of it; the scheduler's PrefillOrder says which
goes next. A request's chunks start at multiples of `prefill_chunk` from
where its prefill started, whoever shares the step, so its numbers do not
depend on its batch-mates. A long chunk's pass may run a slice of layers
per step (pass_slices.py); while one is in flight, a step stays about one
slice long.

First tokens first: a step whose prompt chunk gives a tenant its next token
beside another tenant's decode rows runs its prompt chunks alone, the
decode rows next step (the engine emits a step's samples when its passes
end, so the short prompt's first token would otherwise wait for the
flood's decode pass too). Never two steps in a row, so a stream of short
prompts cannot starve the decode rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bulkhead.engine.decode_rounds import DecodeRounds
from bulkhead.engine.kv_quota import Preempt
from bulkhead.engine.pass_slices import InFlightPass, layers_per_slice
from bulkhead.engine.request import Request, RequestStatus
from bulkhead.engine.step_plan import DecodeWork, PrefillWork

if TYPE_CHECKING:
    from bulkhead.engine.scheduler import Scheduler


class ChunkPlanner:
    def __init__(self, scheduler: Scheduler):
        self._s = scheduler
        # Tokens of a whole pass a slice costs; 0 = passes run whole (the order decides, once).
        self.slice_tokens = scheduler.order.slice_tokens(scheduler.config.slice_tokens)
        self._deferred_decode = False  # the last step left its decode rows to this one
        # Decode rows in groups within decode_step_tokens (decode_rounds.py); whole batches when passes run whole.
        self.rounds = DecodeRounds(scheduler.config.decode_step_tokens if self.slice_tokens else 0)

    def first_tokens_first(self, prefills: list[PrefillWork], decode: list[DecodeWork]) -> bool:
        """The step runs its prompt chunks alone, its decode rows next step (the module docstring)."""
        samplers = {w.tenant for w in prefills if w.samples and w.layers is None}
        defer = not self._deferred_decode and any(samplers - {w.tenant} for w in decode)
        self._deferred_decode = defer
        return defer

    def first_token_waits(self) -> bool:
        """Another tenant's work is here, and a waiting prompt short enough to
        run whole beside a slice is its tenant's one request (a tenant with a
        queue is a flood, not a waiting first token): the engine runs the next
        step in the same core-lease turn (Engine._step_in_turn). Never with
        whole passes (first come, first served: nobody is let ahead)."""
        s = self._s
        live = s.waiting.active
        if not self.slice_tokens or len(live) < 2:
            return False
        whole = max(self.slice_tokens, s.config.whole_pass_tokens)
        return any(live[r.tenant] == 1 and r.prefill_target - r.num_computed <= whole for r in s.waiting)

    def contended(self, tenant: str) -> bool:
        """Another tenant has a request here: a whole pass of tenant's would make it wait."""
        return any(r.tenant != tenant for r in self._s.requests.values())

    def plan_decode(self, preempted: list[str]) -> list[DecodeWork]:
        """A row for every decoding request due this round, oldest first (growth may preempt newer ones)."""
        s = self._s
        work = []
        for req in self.rounds.group(sorted((r for r in s.running if r.decoding), key=lambda r: r.arrival)):
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted while making room for an older request
            if not s.growth.grow(req, req.num_computed + 1, preempted, Preempt.ANY):
                continue
            work.append(DecodeWork(req.request_id, req.tenant, req.num_computed, req.token_at(req.num_computed),
                                   tuple(s.page_table(req)), req.adapter))
        return work

    def plan_prefills(self, budget: int, preempted: list[str]) -> list[PrefillWork]:
        """Chunks in the order's order within budget and _limit()."""
        s = self._s
        works: list[PrefillWork] = []
        planned: set[str] = set()
        passed_over: set[str] = set()
        if s.in_flight is not None:
            planned.add(s.in_flight.work.request_id)
        while True:
            planned.update(preempted)  # never re-admitted in the step that preempted it
            room = len(s.running) < s.config.max_running
            candidates = s.order.candidates(s.running, s.waiting, planned, passed_over, room)
            if not candidates:
                return works
            req, running = min(candidates, key=lambda c: s.order.rank(*c, self._next_chunk_tokens(c[0])))
            work = self._plan_chunk(req, running, self._limit(req, works, budget), preempted)
            (planned if work is not None else passed_over).add(req.request_id)
            if work is not None:
                works.append(self._sliced(work))
                budget -= len(work.token_ids)

    def _limit(self, req: Request, works: list[PrefillWork], budget: int) -> int | None:
        """The most tokens req's chunk may compute beside works (None: no limit,
        the step's first chunk when no pass is in flight). Beside a pass in
        flight, chunks run whole in about a slice's time; but the first to
        join, when another tenant's, may run up to whole_pass_tokens, or its
        prompt would wait out the whole pass for being a little over a slice."""
        s = self._s
        if s.in_flight is None:
            return None if not works else budget
        beside_pass = not works and req.tenant != s.in_flight.work.tenant
        cap = max(self.slice_tokens, s.config.whole_pass_tokens) if beside_pass else self.slice_tokens
        return min(budget, cap - sum(len(w.token_ids) for w in works))

    def _next_chunk_tokens(self, req: Request) -> int:
        """Prompt tokens req's next chunk computes (before any prefix-cache hit)."""
        return min(req.prefill_target - req.num_computed, self._s.config.prefill_chunk)

    def _plan_chunk(self, req: Request, running: bool, budget: int | None,
                    preempted: list[str]) -> PrefillWork | None:
        """The next chunk of req, if it fits the budget (None: no limit) and
        its pages can be had (preempting as kv_quota's table allows)."""
        s = self._s
        if not running:
            s.pins.pin_cached_prefix(req)
        end = min(req.prefill_target, req.num_computed + s.config.prefill_chunk)
        if (budget is not None and end - req.num_computed > budget) or end == req.num_computed:
            if not running:
                s.pins.unpin(req)
            return None
        if not running and not self._start(req, end, preempted):
            return None
        if running and not s.growth.grow(req, end, preempted, Preempt.ANY):
            return None
        fresh = end - max(req.num_computed, req.charged)
        if fresh > 0:
            s.waiting.charge(req.tenant, prompt_tokens=fresh)
        req.charged = max(req.charged, end)
        tokens = tuple(req.token_at(i) for i in range(req.num_computed, end))
        wants_prompt_logprobs = req.params.prompt_logprobs is not None
        return PrefillWork(req.request_id, req.tenant, req.num_computed, tokens, tuple(s.page_table(req)),
                           samples=end == req.num_tokens,
                           # once: a recompute after a preemption has sent its prompt logprobs already
                           all_logits=wants_prompt_logprobs and not req.output_token_ids
                           and req.num_computed < len(req.prompt_token_ids), adapter=req.adapter)

    def _start(self, req: Request, end: int, preempted: list[str]) -> bool:
        """Move a waiting request into the batch with pages for [0, end);
        it may preempt only as kv_quota's table lets a waiting request."""
        s = self._s
        policy = Preempt.NOBODY if s.growth.has_room_for(req, end) else Preempt.OTHERS_OVER_QUOTA
        if not s.growth.grow(req, end, preempted, policy):
            s.pins.unpin(req)
            return False
        s.waiting.remove(req)
        req.status = RequestStatus.RUNNING
        s.running.append(req)
        return True

    def _sliced(self, work: PrefillWork) -> PrefillWork:
        """work, or its pass's first slice: when it is longer than a slice and
        another tenant waits, or longer than whole_pass_tokens whoever waits
        (a prompt arriving mid-pass then waits one slice, not the pass)."""
        s, cfg = self._s, self._s.config
        per = layers_per_slice(cfg.num_layers, len(work.token_ids), self.slice_tokens)
        long = len(work.token_ids) > cfg.whole_pass_tokens
        if per >= cfg.num_layers or s.in_flight is not None or not (long or self.contended(work.tenant)):
            return work
        s.in_flight = InFlightPass(work, per, cfg.num_layers)
        return s.in_flight.next_slice()
