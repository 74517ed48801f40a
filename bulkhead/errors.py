"""Typed errors in the OpenAI error shape. Each carries what the user needs
to fix the request: which parameter, the limit and the value that broke it."""

from __future__ import annotations

import math
from typing import Any


class BulkheadError(Exception):
    status = 500
    type = "server_error"
    code = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 limit: int | float | None = None, value: Any = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.limit = limit
        self.value = value

    def to_dict(self) -> dict:
        body: dict[str, Any] = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        if self.limit is not None:
            body["limit"] = self.limit
        if self.value is not None:
            # JSON has no NaN or infinity: a non-finite value the client sent comes back as text.
            finite = not isinstance(self.value, float) or math.isfinite(self.value)
            body["value"] = self.value if finite else str(self.value)
        return {"error": body}


class InvalidRequest(BulkheadError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class AuthenticationFailed(BulkheadError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDenied(BulkheadError):
    """A valid key that does not open this endpoint (a tenant's key on /metrics)."""

    status = 403
    type = "invalid_request_error"
    code = "permission_denied"


class BodyTooLarge(InvalidRequest):
    status = 413
    code = "body_too_large"


class Conflict(InvalidRequest):
    status = 409
    code = "conflict"


class RequestCancelled(BulkheadError):
    """Its owner cancelled the request (DELETE /v1/requests/{id}); 499 as for a client that went away."""

    status = 499
    type = "invalid_request_error"
    code = "cancelled"


class NotFound(BulkheadError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class RateLimited(BulkheadError):
    """Over one of the tenant's limits (keys.toml [tenants]): OpenAI's 429
    shape, type "requests" or "tokens" as OpenAI's own, with Retry-After."""

    status = 429
    type = "requests"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: int, kind: str = "requests", **kw):
        super().__init__(message, **kw)
        self.retry_after = retry_after
        self.type = kind

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class Overloaded(BulkheadError):
    status = 503
    code = "server_overloaded"


class AdapterUnavailable(BulkheadError):
    """The worker cannot run the request's adapter as it was admitted: its
    weights on disk changed (another digest) or no longer validate. Refused
    rather than decoded with other weights."""

    status = 503
    code = "adapter_unavailable"


class EngineFailure(BulkheadError):
    """The engine failed this request and refused to answer from unverified state."""

    code = "engine_failure"


class TransferFailedError(EngineFailure):
    """Decode could not verify the KV a prefill worker wrote (fail closed)."""

    code = "kv_transfer_failed"


class PeerLostError(BulkheadError):
    """A worker holding the request stopped answering or restarted."""

    status = 503
    code = "worker_lost"


class RequestTimedOut(BulkheadError):
    status = 504
    code = "request_timed_out"
