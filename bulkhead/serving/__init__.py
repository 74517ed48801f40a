"""The contract between the HTTP layer and whatever serves it: `backend.Backend`,
which `server.local_backend` (one process) and `disagg.router` (a cluster)
implement, and `info.engine_info`, one engine's `/server_info` body. server
and disagg both import it and neither imports the other; it imports no engine
and no model and loads no torch, so the router process can import it.
"""
