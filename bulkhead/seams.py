"""Where a harness may substitute a component of a running server.

Production builds every part with the defaults below (where a field is
None, the component's own) and never names a test fault. The fault matrix
(tests/faults/harness.py) and the simulator (bulkhead/sim) build wrappers
at these seams instead of reaching into the code paths: a link that loses
or reorders messages, a transfer source that bends writes, a scrub that
does not scrub, an admission function that lets a rejected request
through. Each seam is a component the system has anyway.

    make_link(signer, router_address)   a worker's control-plane link (None: disagg's own)
    make_source(backend_name, **opts)   prefill's transfer source, writes pages (None: disagg's own)
    make_transfer_executor()            the thread that runs prefill's transfers
    wrap_engine(engine)                 the engine workers and the server talk to
    scrub(pool, ledger)                 release of freed pages (scrub, then reuse)
    make_scheduler(config, ledger, **)  the engine's scheduler
    admit(...)                          the colocated server's admission decision
    worker_command                      how `--role local` starts a worker process
    counters()                          extra counters for heartbeats and /server_info

It sits above the engine and below the server and disagg, and imports only
downward: the engine's parts come from bulkhead.engine.engine_parts; the
workers' link and source are factories a harness passes (tests/test_layout.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field

from bulkhead.engine.admission import admit
from bulkhead.engine.engine_parts import EngineParts


def _transfer_executor() -> Executor:
    # One writer at a time: transfers of one worker share its pool and link.
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="bulkhead-transfer")


@dataclass(frozen=True)
class Seams(EngineParts):
    """The engine's parts (scrub, make_scheduler, wrap_engine: EngineParts,
    which build_engine reads) and those of the workers and the server."""
    # None: the worker's own (disagg.zmq_links.WorkerLink, disagg.transfer.make_source).
    # This record sits below disagg, so it takes these factories and names none.
    make_link: Callable | None = None
    make_source: Callable | None = None
    make_transfer_executor: Callable[[], Executor] = _transfer_executor
    admit: Callable = admit
    # `python -m bulkhead.cli`: a spawned worker runs this command's `serve`.
    worker_command: tuple[str, ...] = field(default_factory=lambda: (sys.executable, "-m", "bulkhead.cli"))
    counters: Callable[[], dict] = dict


PRODUCTION = Seams()
