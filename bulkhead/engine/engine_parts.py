"""The parts of an engine a harness may substitute, and the engine's own.
`build_engine` takes them as factories; `Seams` (bulkhead/seams.py, above
the engine) extends this record with the workers' and the server's seams.
Torch-free: the HTTP process imports it through the seams record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bulkhead.engine.scheduler import Scheduler


def _scrub_released(pool, ledger) -> int:
    from bulkhead.kv.pool import scrub_released  # torch: loaded only where a pool exists

    return scrub_released(pool, ledger)


def _as_built(engine):
    return engine


@dataclass(frozen=True)
class EngineParts:
    scrub: Callable[..., int] = _scrub_released  # (pool, ledger): release freed pages, scrubbed, for reuse
    make_scheduler: Callable[..., Scheduler] = Scheduler  # (config, ledger, **options)
    wrap_engine: Callable = _as_built  # the engine workers and the server talk to


OWN_PARTS = EngineParts()
