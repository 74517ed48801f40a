"""How much of the running system a search explored: for each runtime
handler (bulkhead.verify.handlers), whether the search took every
outcome of the transition functions it calls.

    covered        the search took every outcome the handler's functions
                   share with the model (outcomes only the model takes,
                   each declared with why, are not asked of the runtime)
    no state       the handler changes no request's state (a relay, the registry)
    NOT COVERED    some shared outcome was never taken: the search is too
                   small, or the function has a branch the model never reaches
"""
from __future__ import annotations

from dataclasses import dataclass

from bulkhead.protocol.transitions import REGISTRY
from bulkhead.verify.handlers import HANDLERS, Handler


@dataclass(frozen=True)
class HandlerCoverage:
    handler: Handler
    missing: tuple[tuple[str, str], ...]        # shared (function, outcome) the search never took

    @property
    def status(self) -> str:
        if not self.handler.transitions:
            return "no state"
        return "NOT COVERED" if self.missing else "covered"


def handler_coverage(explored: set[tuple[str, str]]) -> list[HandlerCoverage]:
    out = []
    for handler in HANDLERS:
        missing = tuple((name, outcome) for name in handler.transitions for outcome in REGISTRY[name].outcomes
                        if outcome not in REGISTRY[name].model_only and (name, outcome) not in explored)
        out.append(HandlerCoverage(handler, missing))
    return out


def summary(rows: list[HandlerCoverage]) -> str:
    """One line: how many of the runtime's handlers the searches covered."""
    stateful = [r for r in rows if r.handler.transitions]
    covered = [r for r in stateful if not r.missing]
    return (f"runtime handlers: {len(covered)} of {len(stateful)} that change a request's state run only "
            f"transitions this search took every outcome of; {len(rows) - len(stateful)} change no request's state")


def format_coverage(rows: list[HandlerCoverage]) -> str:
    lines = [summary(rows), "", f"{'actor':8} {'handler':24} {'status':12} transition functions"]
    for r in rows:
        h = r.handler
        what = ", ".join(h.transitions) if h.transitions else h.why_none
        lines.append(f"{h.actor:8} {h.on:24} {r.status:12} {what}")
        for name, outcome in r.missing:
            lines.append(f"{'':46} never taken: {name} -> {outcome}")
    lines += ["", "Steps only the model takes (the runtime cannot reach them):"]
    for name, info in sorted(REGISTRY.items()):
        for outcome, why in info.model_only.items():
            lines.append(f"  {name} -> {outcome}: {why}")
    return "\n".join(lines)
