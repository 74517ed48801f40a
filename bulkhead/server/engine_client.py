"""Bridge between the asyncio HTTP server and the engine thread."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from bulkhead.engine.admission import Admitted
from bulkhead.engine.engine import Engine
from bulkhead.engine.outputs import RequestOutput


class AsyncEngineClient:
    def __init__(self, engine: Engine):
        self.engine = engine

    async def generate(self, tickets: list[Admitted]) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Submit tickets together; yield (ticket index, update) until all finish.

        Leaving the iterator early (client gone, error, cancellation) aborts
        every unfinished ticket, so its pages go back to the pool scrubbed.
        """
        loop = asyncio.get_running_loop()
        updates: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
        index = {t.request_id: i for i, t in enumerate(tickets)}
        pending = set(index)

        def sink(out: RequestOutput) -> None:  # runs on the engine thread
            loop.call_soon_threadsafe(updates.put_nowait, (index[out.request_id], out))

        for t in tickets:
            if t.client_id is not None:  # the client's X-Request-Id, for `bulkhead lineage request`
                self.engine.lineage.named(t.request_id, t.tenant, t.client_id)
            if t.adapter is not None:  # before its first page: every allocation is recorded with it
                self.engine.lineage.adapter(t.request_id, t.tenant, t.adapter.name, t.adapter.digest)
            self.engine.submit(t, sink)
        try:
            while pending:
                i, out = await updates.get()
                if out.finished:
                    pending.discard(out.request_id)
                yield i, out
        finally:
            for rid in pending:
                self.engine.abort(rid)
