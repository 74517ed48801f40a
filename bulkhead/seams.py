"""Where a harness may substitute a component of a running server.

Production builds every part with the defaults below and never names a test
fault. The fault matrix (tests/faults/harness.py) and the simulator
(bulkhead/sim) build wrappers at these seams instead of reaching into the
code paths: a link that loses or reorders messages, a transfer source that
bends writes, a scrub that does not scrub, an admission function that lets
a rejected request through. Each seam is a component the system has anyway.

    make_link(signer, router_address)   a worker's control-plane link
    make_source(backend_name, **opts)   prefill's transfer source (writes pages)
    make_transfer_executor()            the thread that runs prefill's transfers
    wrap_engine(engine)                 the engine workers and the server talk to
    scrub(pool, ledger)                 release of freed pages (scrub, then reuse)
    make_scheduler(config, ledger, **)  the engine's scheduler
    admit(...)                          the colocated server's admission decision
    worker_command                      how `--role local` starts a worker process
    counters()                          extra counters for heartbeats and /server_info
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field


def _transfer_executor() -> Executor:
    # One writer at a time: transfers of one worker share its pool and link.
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="bulkhead-transfer")


def _default_link(signer, router_address: str):
    from bulkhead.disagg.zmq_links import WorkerLink

    return WorkerLink(signer, router_address)


def _default_source(name: str, **opts):
    from bulkhead.disagg.transfer import make_source

    return make_source(name, **opts)


def _default_scrub(pool, ledger) -> int:
    from bulkhead.kv.pool import scrub_released

    return scrub_released(pool, ledger)


def _default_scheduler(*args, **kwargs):
    from bulkhead.engine.scheduler import Scheduler

    return Scheduler(*args, **kwargs)


def _default_admit(*args, **kwargs):
    from bulkhead.engine.admission import admit

    return admit(*args, **kwargs)


@dataclass(frozen=True)
class Seams:
    make_link: Callable = _default_link
    make_source: Callable = _default_source
    make_transfer_executor: Callable[[], Executor] = _transfer_executor
    wrap_engine: Callable = lambda engine: engine  # noqa: E731
    scrub: Callable = _default_scrub
    make_scheduler: Callable = _default_scheduler
    admit: Callable = _default_admit
    # `python -m bulkhead.cli`: a spawned worker runs this command's `serve`.
    worker_command: tuple[str, ...] = field(default_factory=lambda: (sys.executable, "-m", "bulkhead.cli"))
    counters: Callable[[], dict] = dict


PRODUCTION = Seams()
