"""Where a harness may substitute a component of a running server.

Production builds every part with the defaults below and never names a test
fault. The fault matrix (tests/faults/harness.py) and the simulator
(bulkhead/sim) build wrappers at these seams instead of reaching into the
code paths: a link that loses or reorders messages, a transfer source that
bends writes, a scrub that does not scrub, an admission function that lets
a rejected request through. Each seam is a component the system has anyway.
It sits above the engine and below the server and disagg, and imports only
downward (tests/test_layout.py).
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
    # (signer, router_address) -> a worker's control-plane link; None: disagg.zmq_links.WorkerLink.
    # (backend_name, **opts) -> prefill's transfer source; None: disagg.transfer.make_source.
    # Factories, not imports: this record sits below disagg.
    make_link: Callable | None = None
    make_source: Callable | None = None
    make_transfer_executor: Callable[[], Executor] = _transfer_executor  # the thread running prefill's transfers
    admit: Callable = admit  # the colocated server's admission decision
    # How `--role local` starts a worker process (`python -m bulkhead.cli serve ...`).
    worker_command: tuple[str, ...] = field(default_factory=lambda: (sys.executable, "-m", "bulkhead.cli"))
    counters: Callable[[], dict] = dict  # extra counters for heartbeats and /server_info


PRODUCTION = Seams()
