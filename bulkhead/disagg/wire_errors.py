"""A worker's typed error, rebuilt on the router's side of the link.

A worker sends an error as its status, code and message (the OpenAI shape);
the router rebuilds the same class where the code names one a worker raises
on purpose, so the client gets the error the worker decided (its class,
status, type and code), not a generic failure. Any other code comes back as
an EngineFailure that keeps the worker's code and status.
"""

from __future__ import annotations

from bulkhead.errors import AdapterUnavailable, BulkheadError, EngineFailure, Overloaded

# The errors a worker's engine refuses a request with by design.
BY_CODE: dict[str, type[BulkheadError]] = {cls.code: cls for cls in (AdapterUnavailable, Overloaded)}


def error_from_wire(message: str, code: str | None, status: int | None = None,
                    param: str | None = None) -> BulkheadError:
    cls = BY_CODE.get(code or "")
    if cls is not None:
        return cls(message, param=param)
    error = EngineFailure(message, code=code, param=param)
    if status is not None:
        error.status = int(status)
    return error
