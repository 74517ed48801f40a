"""What the engine does with each command another thread queued (commands.py).

Each handler runs on the engine thread, between steps, under engine.lock
(Engine._take_commands): the only place besides the step that changes the
scheduler, the sinks and the sampler's state.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from bulkhead.engine import commands as cmd
from bulkhead.engine.outputs import RequestOutput
from bulkhead.engine.request import FinishReason
from bulkhead.engine.scheduler import QueueFull
from bulkhead.engine.stops import OutputTracker
from bulkhead.errors import AdapterUnavailable, BulkheadError, EngineFailure, Overloaded
from bulkhead.kv.digest import page_digests
from bulkhead.kv.ledger import OutOfPages

if TYPE_CHECKING:
    from bulkhead.engine.engine import Engine

log = logging.getLogger("bulkhead.engine.engine")  # the engine's log, as before the split



def add(engine: Engine, c: cmd.Add) -> None:
    try:
        engine.acquire_adapter(c.ticket)
    except AdapterUnavailable as e:
        c.sink(error_output(c.ticket.request_id, len(c.ticket.prompt_token_ids), e))
        return
    try:
        req = engine.scheduler.add(c.ticket)
    except QueueFull as e:
        engine.release_adapter(c.ticket.adapter.digest if c.ticket.adapter else None)
        c.sink(error_output(c.ticket.request_id, len(c.ticket.prompt_token_ids), Overloaded(str(e))))
        return
    engine._sinks[req.request_id] = c.sink
    engine._trackers[req.request_id] = OutputTracker(engine.tokenizer, req, engine.sampler.eos_token_ids)


def abort(engine: Engine, c: cmd.Abort) -> None:
    engine._finish(c.request_id, FinishReason.ABORT)
    engine._scrub()


def start_prefilled(engine: Engine, c: cmd.StartPrefilled) -> None:
    ticket, rid = c.ticket, c.ticket.request_id
    try:
        if c.sampler_state is not None:
            engine.sampler.set_state(rid, c.sampler_state)
        engine.acquire_adapter(ticket)
        try:
            req = engine.scheduler.add_prefilled(ticket, c.first_token)
        except Exception:
            engine.release_adapter(ticket.adapter.digest if ticket.adapter else None)
            raise
    except AdapterUnavailable as e:  # the adapter's weights changed since admission: refused, not decoded
        engine.sampler.forget(rid)
        engine.release_reserved(rid)
        c.sink(error_output(rid, len(ticket.prompt_token_ids), e))
        return
    except Exception as e:  # fail this request closed; its pages go back scrubbed
        log.exception("could not start decoding %s", rid)
        engine.sampler.forget(rid)
        engine.release_reserved(rid)
        c.sink(error_output(rid, len(ticket.prompt_token_ids), EngineFailure(f"cannot decode: {e}")))
        return
    engine._sinks[rid] = c.sink
    engine._trackers[rid] = OutputTracker(engine.tokenizer, req, engine.sampler.eos_token_ids)
    engine._emit_token(req, c.first_token, c.first_logprobs, c.prompt_logprobs)


def reserve(engine: Engine, c: cmd.Reserve) -> None:
    try:
        pages = engine.reserve(c.request_id, c.tenant, c.num_pages)
    except OutOfPages:
        c.result.set_result(None)  # the caller asks again once pages are freed
        return
    except Exception as e:
        c.result.set_exception(e)
        return
    c.result.set_result((pages, [engine.ledger.generation(p) for p in pages]))


def release_reserved(engine: Engine, c: cmd.ReleaseReserved) -> None:
    engine.release_reserved(c.request_id)


def read_pages(engine: Engine, c: cmd.ReadPages) -> None:
    try:
        owners = tuple(engine.ledger.record(p).owner for p in c.pages)
        generations = tuple(engine.ledger.generation(p) for p in c.pages)
        digests = tuple(page_digests(engine.pool, list(c.pages))) if c.digests else None
    except Exception as e:  # a page outside the pool: the caller fails closed
        c.result.set_exception(e)
        return
    c.result.set_result(cmd.PageFacts(owners, generations, digests))


def call(engine: Engine, c: cmd.Call) -> None:
    try:
        c.result.set_result(c.fn())
    except Exception as e:  # the caller decides what a failure means
        c.result.set_exception(e)


def error_output(request_id: str, prompt_tokens: int, error: BulkheadError) -> RequestOutput:
    return RequestOutput(request_id, (), "", (), True, FinishReason.ERROR.value, prompt_tokens, 0, error)


# Wake has no handler: it only unblocks the engine's wait for commands.
HANDLERS = {cmd.Add: add, cmd.Abort: abort, cmd.StartPrefilled: start_prefilled, cmd.Reserve: reserve,
            cmd.ReleaseReserved: release_reserved, cmd.ReadPages: read_pages, cmd.Call: call}
