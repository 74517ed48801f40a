"""The prefill/decode transfer protocol: what the running router and
workers (bulkhead.disagg) and the model checker (bulkhead.verify) share,
and nothing else. Importers name the module they use; this package
re-exports nothing, so a worker that imports the ticket loads no actor of
the checker's.

    types.py        Phase (where a request is) and Outcome (how it ended)
    lifecycle.py    every phase change, per actor, as one table: advance()
    transitions.py  the transition decorator, JobStep and Effect
    router_job.py   the router's decisions about one request
    prefill_job.py  prefill's decisions about one request
    decode_job.py   decode's decisions about one request
    messages.py     every control message, one frozen type each
    ticket.py       the admission ticket and its signed wrapper
    manifest.py     the transfer manifest, and decode's checks of it
                    (write_admissible, coverage_problems, ...)
    outputs.py      what a request produces (RequestOutput, TokenLogprobs)

Every decision about one request (its next phase, and the effects to carry
out) is a transition function of router_job.py, prefill_job.py or
decode_job.py, called by the runtime's handlers (bulkhead.disagg.router,
prefill_worker, decode_worker; bulkhead/verify/handlers.py lists them) and
by the model checker's actors (bulkhead/verify/actors/, whose docstring
walks a request's life) alike; `bulkhead verify --coverage` reports which
handlers its search covered. Every phase change is a row of lifecycle.py,
made through lifecycle.advance, so the checker explores exactly those
rows; the runtime uses the same table.

Pure: frozen dataclasses, enums and functions over ids and ints; no torch,
no sockets, no threads, and no import of bulkhead.verify
(tests/test_layout.py).
"""
