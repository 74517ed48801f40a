"""The engine: one thread that owns the scheduler, the pool and the model.

Everything that touches pages happens on this thread, so the ledger needs no
locks. Other threads talk to it through `submit` and `abort`, which only
enqueue commands. A step is: take commands, schedule, run, sample, record,
scrub what was freed.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from bulkhead.engine import legacy
from bulkhead.engine.admission import Admitted
from bulkhead.engine.request import FinishReason, Request
from bulkhead.engine.runner import ModelRunner
from bulkhead.engine.sampler import Sampler, TokenLogprobs
from bulkhead.engine.scheduler import QueueFull, Scheduler, StepPlan
from bulkhead.engine.stops import OutputTracker
from bulkhead.errors import BulkheadError, EngineFailure, Overloaded
from bulkhead.faults import Faults
from bulkhead.kv.pool import KVPool
from bulkhead.model.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestOutput:
    """One update for one request: what is new since the last update."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprobs, ...]
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    error: BulkheadError | None = None
    # Prefill-only engines: the pages still holding the prompt's KV and the
    # sampler state, handed to the transfer.
    held_pages: tuple[int, ...] = ()
    sampler_state: bytes | None = None


Sink = Callable[[RequestOutput], None]


@dataclass
class EngineStats:
    steps: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # by finish reason
    failures: int = 0


class Engine:
    def __init__(self, scheduler: Scheduler, runner: ModelRunner, sampler: Sampler, pool: KVPool, tokenizer: Tokenizer,
                 prefill_only: bool = False, faults: Faults | None = None):
        """prefill_only: a request ends at its first token and keeps its pages
        (reserved) for a KV transfer; release_reserved() gives them back."""
        self.scheduler = scheduler
        self.runner = runner
        self.sampler = sampler
        self.pool = pool
        self.ledger = scheduler.ledger
        self.tokenizer = tokenizer
        self.prefill_only = prefill_only
        self.faults = faults or Faults(path="")
        # Request ids owning pages outside the scheduler: prefill pages held
        # until transferred, decode pages granted and awaiting their KV.
        self.reserved: set[str] = set()
        self.stats = EngineStats()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._trackers: dict[str, OutputTracker] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # Serialises whole steps against readers of engine state (tests, /server_info).
        self.lock = threading.Lock()

    # -- called from any thread ---------------------------------------------
    def submit(self, ticket: Admitted, sink: Sink) -> None:
        if not isinstance(ticket, Admitted):
            raise TypeError(f"the engine only accepts Admitted tickets, not {type(ticket).__name__}")
        self._commands.put(("add", ticket, sink))

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id, None))

    def submit_prefilled(self, ticket: Admitted, first_token: int, first_logprobs: TokenLogprobs | None,
                         sampler_state: bytes | None, sink: Sink) -> None:
        """Start decoding a request whose prompt KV is already verified in its pages."""
        if not isinstance(ticket, Admitted):
            raise TypeError(f"the engine only accepts Admitted tickets, not {type(ticket).__name__}")
        self._commands.put(("prefilled", (ticket, first_token, first_logprobs, sampler_state), sink))

    def call(self, fn: Callable[[], object]) -> Future:
        """Run fn on the engine thread (the only thread that may touch the
        ledger and the pool); the future carries its result."""
        future: Future = Future()
        self._commands.put(("call", (fn, future), None))
        return future

    def reserve(self, request_id: str, tenant: str, num_pages: int) -> list[int]:
        """Engine thread only: pages for a request that is not scheduled yet."""
        pages = self.ledger.allocate(request_id, tenant, num_pages)
        self.reserved.add(request_id)
        return pages

    def release_reserved(self, request_id: str) -> None:
        """Engine thread only: give back (scrubbed) what reserve() or a
        prefill-only finish kept."""
        if request_id in self.reserved:
            self.reserved.discard(request_id)
            if request_id in self.scheduler.kept:
                self.scheduler.release_kept(request_id)  # prompt pages may feed the prefix cache
            else:
                self.ledger.release(request_id)
            self._scrub()

    def start(self) -> None:
        """Run the engine on a thread of its own (tests, and processes whose
        main thread is taken); servers call run_forever() on the main thread."""
        self._thread = threading.Thread(target=self.run_forever, name="bulkhead-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._commands.put(("wake", None, None))
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
                self.step()
            except Exception:  # never let the serving thread die silently
                log.exception("engine step failed")

    def _take_commands(self, block: bool) -> None:
        try:
            cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(*cmd)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, kind: str, arg, sink: Sink | None) -> None:
        with self.lock:
            if kind == "add":
                try:
                    # A LegacyTicket exists only when a test armed legacy_admission.
                    req = legacy.add_stub(self.scheduler, arg) if isinstance(arg, legacy.LegacyTicket) \
                        else self.scheduler.add(arg)
                except QueueFull as e:
                    sink(_error_output(arg.request_id, len(arg.prompt_token_ids), Overloaded(str(e))))
                    return
                self._sinks[req.request_id] = sink
                self._trackers[req.request_id] = OutputTracker(self.tokenizer, req, self.sampler.eos_token_ids)
            elif kind == "abort":
                self._finish(arg, FinishReason.ABORT)
                self._scrub()
            elif kind == "prefilled":
                ticket, token, lp, state = arg
                rid = ticket.request_id
                try:
                    if state is not None:
                        self.sampler.set_state(rid, state)
                    tracker_req = self.scheduler.add_prefilled(ticket, token)
                except Exception as e:  # fail this request closed; its pages go back scrubbed
                    log.exception("could not start decoding %s", rid)
                    self.sampler.forget(rid)
                    self.release_reserved(rid)
                    sink(_error_output(rid, len(ticket.prompt_token_ids), EngineFailure(f"cannot decode: {e}")))
                    return
                self.reserved.discard(rid)
                self._sinks[rid] = sink
                self._trackers[rid] = OutputTracker(self.tokenizer, tracker_req, self.sampler.eos_token_ids)
                self._emit_token(tracker_req, token, lp)
            elif kind == "call":
                fn, future = arg
                try:
                    future.set_result(fn())
                except Exception as e:  # the caller decides what a failure means
                    future.set_exception(e)

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
        with self.lock:
            plan = self.scheduler.schedule()
            if plan is None:
                self._scrub()
                return False
            self._scrub()  # preemption released pages
            try:
                ids, logits = self.runner.run(plan)
                requests = [self.scheduler.requests[i] for i in ids]
                tokens, logprobs = self.sampler.sample(requests, logits)
            except Exception as e:
                log.exception("step failed; failing its requests closed")
                self._fail_plan(plan, e)
                return True
            self.stats.steps += 1
            self.stats.prefill_tokens += sum(len(w.token_ids) for w in plan.prefills)
            self.stats.decode_tokens += len(plan.decode)
            sampled = dict(zip(ids, tokens))
            lp_by_id = dict(zip(ids, logprobs))
            for req in self.scheduler.complete(plan, sampled):
                self._emit_token(req, sampled[req.request_id], lp_by_id[req.request_id])
            self._scrub()
            return True

    def _emit_token(self, req: Request, token_id: int, lp: TokenLogprobs | None) -> None:
        if self.prefill_only:
            self._hand_over(req, token_id, lp)
            return
        tracker = self._trackers[req.request_id]
        text, reason = tracker.push(token_id)
        out = RequestOutput(
            req.request_id, (token_id,), text, (lp,) if lp is not None else (), reason is not None,
            reason.value if reason else None, len(req.prompt_token_ids), len(req.output_token_ids),
        )
        sink = self._sinks.get(req.request_id)
        if reason is not None:
            self._finish(req.request_id, reason, notify=False)
        if sink is not None:
            sink(out)

    def _hand_over(self, req: Request, token_id: int, lp: TokenLogprobs | None) -> None:
        """Prefill-only: the first token is sampled; keep the pages for the transfer."""
        rid = req.request_id
        state = self.sampler.get_state(rid)
        held = tuple(self.scheduler.page_table(req))
        self.scheduler.finish(rid, FinishReason.STOP, keep_pages=True)
        self.reserved.add(rid)
        sink = self._sinks.pop(rid, None)
        self._trackers.pop(rid, None)
        self.sampler.forget(rid)
        if sink is not None:
            sink(RequestOutput(rid, (token_id,), "", (lp,) if lp else (), True, "prefilled",
                               len(req.prompt_token_ids), 1, held_pages=held,
                               sampler_state=state))

    def _finish(self, request_id: str, reason: FinishReason, notify: bool = True, error: BulkheadError | None = None):
        req = self.scheduler.finish(request_id, reason)
        sink = self._sinks.pop(request_id, None)
        self._trackers.pop(request_id, None)
        self.sampler.forget(request_id)
        if req is None:
            return
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
            self.scheduler.check_integrity(self.reserved)
            if set(self._sinks) - set(self.scheduler.requests):
                raise AssertionError("sinks kept for finished requests")


def _error_output(request_id: str, prompt_tokens: int, error: BulkheadError) -> RequestOutput:
    return RequestOutput(request_id, (), "", (), True, FinishReason.ERROR.value, prompt_tokens, 0, error)
