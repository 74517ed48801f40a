"""`--role colocated`: the engine and the HTTP server in one process."""

from __future__ import annotations

import logging
import signal
import threading

import uvicorn

from bulkhead.seams import Seams

log = logging.getLogger("bulkhead")


def colocated_backend(config, model_id: str, auth: str, lineage_args, seams: Seams):
    """The LocalBackend over a freshly built engine. torch and the engine
    load here, in a process that holds one: a router never imports them.
    Raises lineage.writer.LineageLogError for a log it cannot open."""
    from bulkhead.engine.builder import build_engine
    from bulkhead.lineage.writer import open_lineage
    from bulkhead.server.local_backend import LocalBackend

    lineage = open_lineage(*lineage_args, "colocated")
    return LocalBackend(build_engine(config, seams=seams, lineage=lineage), model_id, auth)


def serve_colocated(backend, server: uvicorn.Server) -> int:
    """The HTTP server on a thread, the engine on this (the main) thread,
    where torch's parallel ops run fastest (Engine.run_forever). SIGTERM and
    SIGINT stop both; so does the HTTP server ending on its own (a port in use)."""
    engine = backend.built.engine

    def http() -> None:
        try:
            server.run()  # on a thread, uvicorn installs no signal handlers
        finally:
            engine.stop()

    def shutdown(*_) -> None:
        server.should_exit = True  # uvicorn drains its connections, then http() stops the engine

    previous = {sig: signal.signal(sig, shutdown) for sig in (signal.SIGTERM, signal.SIGINT)}
    thread = threading.Thread(target=http, name="bulkhead-http")
    thread.start()
    try:
        engine.run_forever()
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        engine.lineage.close()
    return 0 if server.started else 1
