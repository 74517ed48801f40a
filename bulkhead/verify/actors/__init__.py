"""The model checker's actors: the prefill/decode transfer protocol as pure
step functions, which bulkhead.verify.checker explores.

Each actor is a function `step(config, state, event) -> Step(state, send,
notes)` over frozen dataclasses: no I/O, no clock, no threads. The checker
feeds it every interleaving an adversarial environment allows. `notes`
(PageRead, WriteLanded, Committed, ClientResponse) are what an observer may
check. Every decision about a request is a transition function of
bulkhead.protocol (router_job, prefill_job, decode_job), the same one the
running router and workers call; a step function only carries out its
effects, on the model's ledger (ledger_model.py) and network (network.py).

    router.py        router_step(config, RouterState, event)    events: Submit, ClientAbort,
                         DeadlinePassed, PeerLost, DrainWorker; messages: Output, TransferFailed,
                         PrefillFailed
    prefill.py       prefill_step(config, PrefillState, event)  messages: Assign, PagesGranted,
                         Finalize; events: HandedOver, PromptFailed, Quiesced, WriteFailed
    decode.py        decode_step(config, DecodeState, event)    messages: Assign, PageWrite,
                         Landing, TransferDone, Finalize, DrainAck; events: Reserved, DecodeStep,
                         LeaseExpired
    events.py        events from outside the protocol, notes, and a step's result
    ledger_model.py  decode's page ledger as the model sees it (tests/verify/test_ledger_model_agrees.py
                     replays it against the runtime's kv/ledger.py)
    network.py       the model's Envelope and data plane (PageWrite, Landing)
    config.py        Variant, Guards, ProtocolConfig, RequestSpec
    values.py        addresses, page contents, the model's MAC, state helpers

Control messages are the runtime's own types (bulkhead.protocol.messages),
one class each; the model's network carries each in an Envelope
(destination, signed), which a step function opens. The ticket, signed or
not, is bulkhead.protocol.ticket's.

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
