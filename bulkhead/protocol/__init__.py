"""The prefill/decode transfer protocol as pure transition functions.

Each actor is a function `step(config, state, event) -> Step(state, send,
notes)` over frozen dataclasses: no I/O, no clock, no threads. The model
checker (bulkhead.verify) feeds it every interleaving an adversarial
environment allows. `notes` (PageRead, WriteLanded, Committed,
ClientResponse) are what an observer may check.

Every decision about one request (its next phase, and the effects to carry
out) is a transition function of router_job.py, prefill_job.py or
decode_job.py, called by the step functions here and by the runtime's
handlers alike (bulkhead.disagg.router, prefill_worker, decode_worker;
handlers.py lists them); `bulkhead verify` reports which handlers its
search covered. Every phase change is a row of bulkhead.protocol.lifecycle,
made through lifecycle.advance, so the checker explores exactly those rows;
the runtime uses the same table plus a few runtime-only rows, each saying
where and why the running system differs. Decode's rule for whether a write
may land and its manifest checks are shared too (bulkhead.protocol.manifest).
The simulator (bulkhead.sim) checks the runtime's classes themselves.

    router_step(config, RouterState, event)    events: Submit, ClientAbort,
        DeadlinePassed, PeerLost, DrainWorker; messages: Output, TransferFailed,
        PrefillFailed
    prefill_step(config, PrefillState, event)  messages: Assign, PagesGranted,
        Finalize; events: HandedOver, PromptFailed, Quiesced, WriteFailed
    decode_step(config, DecodeState, event)    messages: Assign, PageWrite,
        Landing, TransferDone, Finalize, DrainAck; events: Reserved, DecodeStep, LeaseExpired

Messages (messages.py) are the runtime's own types, one class each; the
model's network carries each in an Envelope (destination, signed), which a
step function opens. Events and notes are in events.py; the ticket, signed
or not, in ticket.py.

Life of a request (REAL, all guards on):

    actor    from              event / message           to                 sends
    -------  ----------------  ------------------------  -----------------  ------------------------
    router   -                 Submit, over the limit    DONE(REJECTED)     4xx to client, nothing else
    router   -                 Submit, fits              ADMITTED           -
    router   ADMITTED          a room is free            BOOTSTRAPPED       Assign(ticket) to both
    decode   -                 Assign (signed ticket)    WAITING_PAGES      -
    decode   WAITING_PAGES     pages free                (same)             - (the engine reserves them)
    decode   WAITING_PAGES     Reserved                  DECODE_ALLOCATED   PagesGranted(pages, gens)
    prefill  -                 Assign (signed ticket)    WAITING_POOL       -
    prefill  WAITING_POOL      local pages free          (same)             - (the engine computes the prompt)
    prefill  WAITING_POOL      HandedOver                PREFILLING         -
    prefill  PREFILLING        PagesGranted              TRANSFERRING       PageWrite per page, TransferDone
    decode   any               PageWrite, gen current    (same)             Landing (DMA admitted)
    decode   any               Landing                   (same)             - (ledger credits owner@gen)
    decode   DECODE_ALLOCATED  manifest == allocation,   COMMITTED          -
                               all written, digests ok
    decode   DECODE_ALLOCATED  mismatch / bad digest     DRAINING           TransferFailed to router
    decode   COMMITTED         DecodeStep                DECODING           - (tokens)
    prefill  TRANSFERRING      Quiesced (writes ended)   DONE               DrainAck to decode (the success path)
    decode   DECODING          DecodeStep(last)          DONE               Output (finished) to router;
                                                                            pages scrubbed, freed
    router   BOOTSTRAPPED      Output (finished)         DONE(FINISHED)     response (no Finalize)
    router   BOOTSTRAPPED      TransferFailed / ClientAbort /
                               DeadlinePassed / PeerLost DONE(outcome)      Finalize to both, response
    prefill  any live          Finalize                  DRAINING           - (never posts again)
    prefill  DRAINING          Quiesced                  DONE               DrainAck to decode
    decode   allocated         Finalize                  DRAINING           -
    decode   committed         Finalize                  (same)             - (the engine ends it: pages
                                                                            freed at its next step)
    decode   DRAINING          DrainAck / LeaseExpired   DONE               - (pages scrubbed, freed)

A success ends at each actor on its own: decode frees the pages with the
last token (no write is admitted after the commit), prefill acks as its
writes end, and the router answers the client; no Finalize is sent.
Every failure ends in one outcome (Outcome), decided by the router alone and
recorded by both workers from its Finalize. Unsigned (forged) control
messages are dropped; duplicates and late messages are no-ops.
"""
from __future__ import annotations

from bulkhead.protocol.decode import (
    DecodeRequest, DecodeState, decode_initial, decode_restart, decode_step,
)
from bulkhead.protocol.events import *  # noqa: F401,F403 - events and notes
from bulkhead.protocol.ledger_model import Ledger, PageEntry
from bulkhead.protocol.manifest import Manifest
from bulkhead.protocol.messages import *  # noqa: F401,F403 - the message vocabulary
from bulkhead.protocol.prefill import PrefillRequest, PrefillState, prefill_restart, prefill_step
from bulkhead.protocol.router import RouterRequest, RouterState, router_step
from bulkhead.protocol.ticket import MODEL_MAC, SignedTicket, Ticket
from bulkhead.protocol.types import (
    GARBAGE, ROUTER, ZERO, Guards, Outcome, Phase, ProtocolConfig, RequestSpec,
    Variant, decode_addr, digest_of, kv_origin, prefill_addr,
)

__all__ = [
    "router_step", "prefill_step", "decode_step", "decode_initial", "decode_restart",
    "prefill_restart", "RouterState", "RouterRequest", "PrefillState", "PrefillRequest",
    "DecodeState", "DecodeRequest", "Ledger", "PageEntry", "Guards", "Manifest", "Outcome",
    "Phase", "ProtocolConfig", "RequestSpec", "Ticket", "SignedTicket", "MODEL_MAC", "Variant", "ROUTER", "ZERO",
    "GARBAGE", "decode_addr", "prefill_addr", "digest_of", "kv_origin",
]
