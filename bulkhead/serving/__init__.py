"""The contract between the HTTP layer and whatever serves it.

`backend.Backend` is what `bulkhead.server` calls (tokenizer, live limits,
`generate`, `/server_info`, a metrics collector); `server.local_backend`
(one process, the engine beside the HTTP server) and `disagg.router` (a
cluster of workers) implement it. `info.engine_info` is the `/server_info`
body of one engine, reported by the colocated backend and by every worker.

It sits between the two so that imports point one way: `server` and `disagg`
both import this package and neither imports the other (only the launcher,
`bulkhead/launch/`, knows both). It imports no engine and no model (the
engine imports `memory.py`), and loads no torch, so the router process,
which computes nothing, can import it.
"""
