"""The prefill/decode transfer protocol: what the running router and
workers (bulkhead.disagg) and the model checker (bulkhead.verify) share,
and nothing else. This package re-exports nothing, so a worker that imports
the ticket loads no actor of the checker's.

Every decision about one request (its next phase, and the effects to carry
out) is a transition function of router_job.py, prefill_job.py or
decode_job.py, called by the runtime's handlers (bulkhead/verify/handlers.py
lists them) and by the checker's actors alike. Every phase change is a row
of lifecycle.py, made through lifecycle.advance, so the checker explores
exactly the rows the runtime uses.

Pure: frozen dataclasses, enums and functions over ids and ints; no torch,
no sockets, no threads, no import of bulkhead.verify (tests/test_layout.py).
"""
