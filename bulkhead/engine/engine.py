"""The engine: one thread that owns the scheduler, the pool and the model.

Everything that touches pages happens on this thread, so the ledger needs no
locks. Other threads talk to it through `submit` and `abort`, which only
enqueue commands. A step is: take commands, schedule, run, sample, record,
scrub what was freed.

A step is flat: the scheduler plans it, the runner runs it, the engine
samples and emits; nothing calls back into the engine while a pass runs.
A light tenant's short prompt and everyone's next tokens do not wait out
another tenant's long prompt pass because the scheduler hands such a pass
out a slice of layers per step while another tenant has work
(bulkhead.engine.pass_slices): they run in the next step, beside the pass's
next slice. A short prompt's first token does not wait for another tenant's
decode rows either: the scheduler plans the chunk that ends it alone, the
rows in the next step (bulkhead.engine.chunk_planning, first tokens first).
Commands are taken between steps only.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from bulkhead.engine import commands as cmd
from bulkhead.engine.command_handlers import HANDLERS
from bulkhead.engine.admission import Admitted
from bulkhead.engine.core_lease import CoreLease
from bulkhead.engine.outputs import RequestOutput, TokenLogprobs
from bulkhead.engine.request import FinishReason, Request
from bulkhead.engine.runner import ModelRunner
from bulkhead.engine.sampler import Sampler, prompt_logprobs
from bulkhead.engine.scheduler import Scheduler
from bulkhead.engine.step_plan import StepPlan
from bulkhead.engine.stops import OutputTracker
from bulkhead.errors import BulkheadError, EngineFailure
from bulkhead.kv.pool import KVPool
from bulkhead.model.tokenizer import Tokenizer

log = logging.getLogger(__name__)


Sink = Callable[[RequestOutput], None]


@dataclass
class EngineStats:
    steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # by finish reason
    failures: int = 0
    slices: int = 0  # slices of layers run of passes handed out in slices (pass_slices.py)


class Engine:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, sampler: Sampler, pool: KVPool, tokenizer: Tokenizer,
                 prefill_only: bool = False, lease: CoreLease | None = None):
        """prefill_only: a request ends at its first token and keeps its pages
        (reserved) for a KV transfer; release_reserved_pages() gives them back.
        lease: the host's core lease (bulkhead.engine.core_lease), or None."""
        self.scheduler = scheduler
        self.runner = runner
        # Where workers on one host take turns with its cores: run_forever's steps hold it.
        self._lease = lease
        self.sampler = sampler
        self.pool = pool
        self.ledger = scheduler.ledger
        self.lineage = self.ledger.lineage  # request ends go to the ledger's lineage sink
        self.tokenizer = tokenizer
        self.prefill_only = prefill_only
        self.stats = EngineStats()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._trackers: dict[str, OutputTracker] = {}
        # Echo's prompt logprobs by request and position, gathered chunk by
        # chunk until the first token goes out with them (a recompute after
        # a preemption finds them there and adds nothing).
        self._prompt_lps: dict[str, dict[int, TokenLogprobs]] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # Serialises whole steps against readers of engine state (tests, /server_info).
        self.lock = threading.Lock()
        # Held while a reserved request's pages change hands (reserve and
        # release_reserved): a decode worker's transfer target checks each
        # remote write against the ledger under the same lock.
        self.page_lock = contextlib.nullcontext()
        # Prefill-only: this turn handed an idle tenant's first token over
        # (_hand_over), so the turn keeps the cores one more step (_step_in_turn).
        self._handed_first = False

    # -- called from any thread ---------------------------------------------
    def submit(self, ticket: Admitted, sink: Sink) -> None:
        if not isinstance(ticket, Admitted):
            raise TypeError(f"the engine only accepts Admitted tickets, not {type(ticket).__name__}")
        self._commands.put(cmd.Add(ticket, sink))

    def abort(self, request_id: str) -> None:
        self._commands.put(cmd.Abort(request_id))

    def submit_prefilled(self, ticket: Admitted, first_token: int, first_logprobs: TokenLogprobs | None,
                         sampler_state: bytes | None, sink: Sink,
                         prompt_logprobs: tuple[TokenLogprobs, ...] = ()) -> None:
        """Start decoding a request whose prompt KV is already verified in its pages."""
        if not isinstance(ticket, Admitted):
            raise TypeError(f"the engine only accepts Admitted tickets, not {type(ticket).__name__}")
        self._commands.put(cmd.StartPrefilled(ticket, first_token, first_logprobs, sampler_state, sink,
                                              prompt_logprobs))

    def reserve_pages(self, request_id: str, tenant: str, num_pages: int) -> Future:
        """Pages for a request whose KV a remote writer will fill; the future
        gives (pages, generations), or None when the pool has no room now."""
        future: Future = Future()
        self._commands.put(cmd.Reserve(request_id, tenant, num_pages, future))
        return future

    def release_reserved_pages(self, request_id: str) -> None:
        """Give back, scrubbed, what reserve_pages() or a prefill-only
        hand-over kept (nothing for a request that holds none)."""
        self._commands.put(cmd.ReleaseReserved(request_id))

    def read_pages(self, request_id: str, pages, digests: bool) -> Future:
        """Owners, generations and (digests=True) digests of pages, read on
        the engine thread; the future gives a commands.PageFacts."""
        future: Future = Future()
        self._commands.put(cmd.ReadPages(request_id, tuple(pages), digests, future))
        return future

    def call(self, fn: Callable[[], object]) -> Future:
        """Tests and tools: run fn on the engine thread; the future carries
        its result. Workers use the typed commands above."""
        future: Future = Future()
        self._commands.put(cmd.Call(fn, future))
        return future

    def reserve(self, request_id: str, tenant: str, num_pages: int) -> list[int]:
        """Engine thread only: pages for a request that is not scheduled yet."""
        with self.page_lock:
            return self.scheduler.reserve_for_remote_kv(request_id, tenant, num_pages)

    def release_reserved(self, request_id: str) -> None:
        """Engine thread only: give back (scrubbed) what reserve() or a
        prefill-only finish kept."""
        with self.page_lock:
            released = self.scheduler.release_reserved(request_id)
        if released:
            self._scrub()

    def start(self) -> None:
        """Run the engine on a thread of its own (tests, and processes whose
        main thread is taken); servers call run_forever() on the main thread."""
        self._thread = threading.Thread(target=self.run_forever, name="bulkhead-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._commands.put(cmd.Wake())
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- the engine thread ------------------------------------------------
    def run_forever(self) -> None:
        """Serve on the calling thread until stop(). The process's main thread
        is the fast place for it: torch's OpenMP-parallel ops started from any
        other thread ran up to 2.5x slower on this project's machine (int4
        matmul 79 vs 200 us; a 1-request decode step 20 vs 31 ms, measured),
        each call waking a worker team of that thread's own."""
        while not self._stop.is_set():
            block = not self.scheduler.has_work()
            try:
                self._take_commands(block=block)
                if self._lease is not None and self.scheduler.has_work():
                    self._step_in_turn(self._lease)
                else:
                    self.step()
            except Exception:  # never let the serving thread die silently
                log.exception("engine step failed")

    def _step_in_turn(self, lease: CoreLease) -> None:
        """One step in this worker's turn with the host's cores (core_lease),
        taking commands meanwhile: a decode worker's grants and commits too.
        A short prompt that came during the step and gives an idle tenant its
        first token (ChunkPlanner.first_token_waits) gets a second step in
        the same turn: turns alternate, so it would otherwise wait for the
        other worker's step too (a decode round of another tenant's flood).
        A prefill worker that handed such a first token over in the turn
        keeps it for one more step where it has work: the hand-off (the
        decode worker's grant, its checks and its first output) runs on the
        decode worker's engine thread, which takes commands only between
        its steps or while it waits for the cores, so the hand-off runs
        beside this step instead of waiting out the decode worker's next
        one. Two extra steps a turn at most."""
        with lease.turn(meanwhile=lambda: self._take_commands(block=True),
                        wake=lambda: self._commands.put(cmd.Wake()), stopped=self._stop.is_set) as held:
            if held:
                self._handed_first = False
                self.step()
                self._take_commands(block=False)
                if self.scheduler.planner.first_token_waits():
                    self.step()
                if self._handed_first and self.scheduler.has_work():
                    self.step()

    def _take_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            with self.lock:
                handler = HANDLERS.get(type(command))
                if handler is not None:  # Wake has none: it only unblocks the get above
                    handler(self, command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def run_once(self) -> bool:
        """Apply the queued commands and run at most one step on the caller's
        thread: the simulator (bulkhead/sim) drives the engine this way, on its
        virtual clock, instead of start(). Returns whether work is left."""
        self._take_commands(block=False)
        self.step()
        return self.has_pending()

    def has_pending(self) -> bool:
        """Commands queued or requests scheduled (for a driver without the thread)."""
        return not self._commands.empty() or self.scheduler.has_work()

    def run_until_idle(self, max_steps: int = 100_000) -> None:
        """Drive the engine on the caller's thread (tests without a server)."""
        for _ in range(max_steps):
            self._take_commands(block=False)
            if not self.scheduler.has_work():
                return
            self.step()
        raise RuntimeError("engine did not become idle")

    def step(self) -> bool:
        """Schedule, run, sample and emit: one step, flat (module docstring).
        A slice of a pass in flight runs last, after the step's other passes
        have sampled and emitted: a short prompt or a next token that waited
        for this step does not wait for the slice too."""
        with self.lock:
            plan = self.scheduler.schedule()
            self._scrub()  # preemption released pages
            if plan is None:
                return False
            slices = tuple(w for w in plan.prefills if w.layers is not None)
            if not slices:  # the usual step (a decode step, whole passes): the plan as it is
                if plan.prefills or plan.decode:
                    self._run_plan(plan)
                return True
            rest = StepPlan(tuple(w for w in plan.prefills if w.layers is None), plan.decode, plan.preempted)
            for part in (rest, StepPlan(slices, (), ())):
                if part.prefills or part.decode:
                    self._run_plan(part)
            self._handed_first = False  # what `rest` handed over went to the decode worker beside the slice
            return True

    def _run_plan(self, plan: StepPlan) -> None:
        try:
            with self.runner.threads_for(plan):  # a lone decode row: one thread (RunnerConfig)
                ids, logits = self.runner.run(plan)
                requests = [self.scheduler.requests[i] for i in ids]
                # A slice that does not end its pass samples nothing.
                tokens, logprobs = self.sampler.sample(requests, logits, self.runner.greedy_picks) if requests \
                    else ([], [])
            for rid, start, rows in self.runner.prompt_rows:
                req = self.scheduler.requests[rid]
                got = prompt_logprobs(rows, start, req.prompt_token_ids, req.params.prompt_logprobs or 0)
                self._prompt_lps.setdefault(rid, {}).update(got)
        except Exception as e:
            log.exception("step failed; failing its requests closed")
            self._fail_plan(plan, e)
            return
        self.stats.steps += 1
        self.stats.slices += sum(1 for w in plan.prefills if w.layers is not None)
        self.stats.prefill_tokens += sum(len(w.token_ids) for w in plan.prefills if w.ends_pass)
        self.stats.decode_tokens += len(plan.decode)
        sampled = dict(zip(ids, tokens))
        lp_by_id = dict(zip(ids, logprobs))
        for req in self.scheduler.complete(plan, sampled):
            self._emit_token(req, sampled[req.request_id], lp_by_id[req.request_id])
        self._scrub()

    def _emit_token(self, req: Request, token_id: int, lp: TokenLogprobs | None,
                    prompt_lps: tuple[TokenLogprobs, ...] = ()) -> None:
        prompt_lps = prompt_lps or self._take_prompt_logprobs(req.request_id)
        if self.prefill_only:
            self._hand_over(req, token_id, lp, prompt_lps)
            return
        tracker = self._trackers[req.request_id]
        text, reason = tracker.push(token_id)
        out = RequestOutput(
            req.request_id, (token_id,), text, (lp,) if lp is not None else (), reason is not None,
            reason.value if reason else None, len(req.prompt_token_ids), len(req.output_token_ids),
            prompt_logprobs=prompt_lps,
        )
        sink = self._sinks.get(req.request_id)
        if reason is not None:
            self._finish(req.request_id, reason, notify=False)
        if sink is not None:
            sink(out)

    def _take_prompt_logprobs(self, rid: str) -> tuple[TokenLogprobs, ...]:
        """The request's prompt logprobs in position order, once: with its first token."""
        got = self._prompt_lps.pop(rid, None)
        return tuple(got[p] for p in sorted(got)) if got else ()

    def _hand_over(self, req: Request, token_id: int, lp: TokenLogprobs | None,
                   prompt_lps: tuple[TokenLogprobs, ...] = ()) -> None:
        """Prefill-only: the first token is sampled; keep the pages for the transfer."""
        rid = req.request_id
        live = self.scheduler.waiting.active
        if live.get(req.tenant) == 1 and len(live) > 1:  # an idle tenant's first token, beside another's work
            self._handed_first = True
        state = self.sampler.get_state(rid)
        held = tuple(self.scheduler.page_table(req))
        self.scheduler.finish(rid, FinishReason.STOP, keep_pages=True)  # kept: held for the transfer
        self.release_adapter(req.adapter)
        if self.lineage.enabled:
            self.lineage.request_end(rid, req.tenant, "prefilled")
        sink = self._sinks.pop(rid, None)
        self._trackers.pop(rid, None)
        self.sampler.forget(rid)
        if sink is not None:
            sink(RequestOutput(rid, (token_id,), "", (lp,) if lp else (), True, "prefilled",
                               len(req.prompt_token_ids), 1, held_pages=held,
                               sampler_state=state, prompt_logprobs=prompt_lps))

    def acquire_adapter(self, ticket: Admitted) -> None:
        """Load or share the weights of the ticket's LoRA adapter; AdapterUnavailable if they changed."""
        if ticket.adapter is not None:
            self.runner.adapters.acquire(ticket.adapter)

    def release_adapter(self, digest: str | None) -> None:
        if digest is not None:
            self.runner.adapters.release(digest)

    def _finish(self, request_id: str, reason: FinishReason, notify: bool = True, error: BulkheadError | None = None):
        req = self.scheduler.finish(request_id, reason)
        self.runner.drop_pass(request_id)  # a pass in flight: its paused rows go with it
        if req is not None:
            self.release_adapter(req.adapter)
        sink = self._sinks.pop(request_id, None)
        self._trackers.pop(request_id, None)
        self._prompt_lps.pop(request_id, None)
        self.sampler.forget(request_id)
        if req is None:
            return
        if self.lineage.enabled:
            self.lineage.request_end(request_id, req.tenant, reason.value)
        self.stats.finished[reason.value] = self.stats.finished.get(reason.value, 0) + 1
        if notify and sink is not None:
            out = RequestOutput(request_id, (), "", (), True, reason.value, len(req.prompt_token_ids),
                                len(req.output_token_ids), error)
            sink(out)

    def _fail_plan(self, plan: StepPlan, exc: Exception) -> None:
        self.stats.failures += 1
        ids = plan.request_ids
        err = EngineFailure(f"the engine failed this request and will not answer from unverified state: {exc}")
        for rid in ids:
            self._finish(rid, FinishReason.ERROR, error=err)
        self._scrub()

    def _scrub(self) -> None:
        # The scheduler's reclaim is the one place that scrubs (the builder
        # picks it: scrub_released, or release_unscrubbed with guards off).
        self.scheduler.reclaim()

    def check_integrity(self) -> None:
        with self.lock:
            self.scheduler.check_integrity()
            if set(self._sinks) - set(self.scheduler.requests):
                raise AssertionError("sinks kept for finished requests")
            if self.sampler.grammars.request_ids() - set(self.scheduler.requests):
                raise AssertionError("grammar matchers kept for finished requests")
            flying = self.scheduler.in_flight
            if self.runner.paused_passes != ({flying.work.request_id} if flying and flying.next_layer else set()):
                raise AssertionError(f"paused passes {self.runner.paused_passes} != the scheduler's in flight")
            using = Counter(r.adapter for r in self.scheduler.requests.values() if r.adapter is not None)
            if self.runner.adapters.users != dict(using):
                raise AssertionError(f"adapters held {self.runner.adapters.users} != the live requests' {dict(using)}")

