"""The prefill/decode transfer protocol: what the running router and
workers (bulkhead.disagg) and the model checker (bulkhead.verify) share,
and nothing else (docs/verification.md, "Shared, and the checker's own").
It re-exports nothing, so a worker that imports the ticket loads no actor
of the checker's. Pure: no torch, sockets, threads, or bulkhead.verify
(tests/test_layout.py).
"""
