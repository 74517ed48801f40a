"""The model checker's actors: the prefill/decode transfer protocol as pure
step functions, which bulkhead.verify.checker explores.

Each actor is `step(config, state, event) -> Step(state, send, notes)` over
frozen dataclasses: no I/O, no clock, no threads. `notes` (PageRead,
WriteLanded, Committed, ClientResponse) are what an observer may check.
Every decision about a request is a transition function of
bulkhead.protocol, the same one the running router and workers call; a step
function only carries out its effects, on the model's ledger
(ledger_model.py) and network (network.py). A request's life, row by row, is
lifecycle.format_table(), copied in docs/verification.md.

A success ends at each actor on its own (no Finalize is sent); every failure
ends in one Outcome, decided by the router alone and recorded by both
workers from its Finalize. Unsigned (forged) control messages are dropped;
duplicates and late messages are no-ops.
"""
