"""Typed errors for the audit commands: each carries what the operator
needs to fix the input or reach the engine; each exits 2."""

from __future__ import annotations


class AuditError(Exception):
    """Base class: anything the audit commands raise on purpose."""


class PlanInputError(AuditError):
    """The model config or a `plan` flag cannot be used as given."""


class MemorySizeError(PlanInputError):
    """A memory size string (`141GiB`, `80GB`, `1234`) did not parse."""

    def __init__(self, text: str, reason: str, what: str = "memory size") -> None:
        super().__init__(f"{what} {text!r}: {reason}")  # what: the flag it came from, when known
        self.text = text


class _EngineError(AuditError):
    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason


class EngineUnreachable(_EngineError):
    """An engine URL could not be read: no connection, timeout, or refused auth."""


class EngineResponseError(_EngineError):
    """An engine answered, but not in a shape any dialect understands."""
