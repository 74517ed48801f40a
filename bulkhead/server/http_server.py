"""uvicorn's server, saying where it serves only once the port is bound.

Logging "serving on ..." before uvicorn binds would announce a server that a
busy port then stops one line later; `BoundServer` calls `on_bound` after
uvicorn's startup has bound its sockets, and not at all when binding failed
(uvicorn then logs the error and exits).
"""

from __future__ import annotations

from collections.abc import Callable

import uvicorn


class BoundServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_bound: Callable[[], None]):
        super().__init__(config)
        self.on_bound = on_bound

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:  # set by uvicorn once every socket is listening
            self.on_bound()
