"""Every phase change a request may make, per actor, as one table.

    advance(actor, phase, event) -> the next phase, or IllegalTransition

The model checker's actors and the runtime's records (bulkhead.disagg's
Route, PrefillJob, DecodeJob) change phase only through advance(), one table
for both, so the checker explores exactly the rows the runtime takes
(tests/disagg/test_lifecycle.py checks that a search takes every row). A
from-phase of None ("-") means no record yet: the event creates it.

LEGACY and the guard ablations take the same rows: they change what the
checks decide, not which phases follow which. With drain_before_reuse off,
decode frees pages at the finalize as though prefill had already acked:
that unfenced reuse is what the ablation shows is unsafe.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from bulkhead.protocol.types import Phase as P


class Actor(enum.Enum):
    ROUTER = "router"
    PREFILL = "prefill"
    DECODE = "decode"

    __hash__ = object.__hash__  # members are singletons; the checker looks rows up millions of times


class Event(enum.Enum):
    """What happened to one request, as the actor that records it sees it."""

    ADMIT = "admit"                          # router: fits the smallest limit of its pair
    REJECT = "reject"                        # router: does not
    BOOTSTRAP = "bootstrap"                  # router: a room is free, the ticket goes to both
    ASSIGN = "assign"                        # worker: a signed ticket arrived
    PREFILLED = "prefilled"                  # prefill: local pages held, the prompt's KV computed
    PAGES_GRANTED = "pages_granted"          # decode grants pages; prefill holds the grant
    MANIFEST_VERIFIED = "manifest_verified"  # decode: manifest == allocation, all written, digests ok
    VERIFY_FAILED = "verify_failed"          # decode: it gives up on the KV
    DECODE_STEP = "decode_step"              # decode: tokens generated and sent on
    FINISHED = "finished"                    # decode: the last token; the pages go with it
    FINALIZE = "finalize"                    # router: decides the outcome; workers: hear it
    QUIESCED = "quiesced"                    # prefill: no write for the request is outstanding
    UNDRAINED = "undrained"                  # prefill (runtime): a write may still land; never acked
    DRAIN_ACK = "drain_ack"                  # decode: prefill's ack (it may have come earlier)
    LEASE_EXPIRED = "lease_expired"          # decode: the fence; no admitted write outlives it

    __hash__ = object.__hash__


ROUTER, PREFILL, DECODE = Actor.ROUTER, Actor.PREFILL, Actor.DECODE
E = Event
NEW = None  # no record yet

# The protocol: what the model checker explores, and what the runtime follows.
PROTOCOL = {
    ROUTER: (
        # from               event                 to                  sends, or why
        (NEW,                E.ADMIT,              P.ADMITTED,         "-"),
        (NEW,                E.REJECT,             P.DONE,             "4xx to the client; nothing else exists"),
        (P.ADMITTED,         E.BOOTSTRAP,          P.BOOTSTRAPPED,     "Assign(ticket) to both workers"),
        (P.ADMITTED,         E.FINALIZE,           P.DONE,             "before a room: no worker knows it"),
        (P.BOOTSTRAPPED,     E.FINALIZE,           P.DONE,             "Finalize(outcome) to both, then the client"),
    ),
    PREFILL: (
        (NEW,                E.ASSIGN,             P.WAITING_POOL,     "-"),
        (NEW,                E.PAGES_GRANTED,      P.WAITING_POOL,     "the grant overtook the ticket: kept"),
        (NEW,                E.FINALIZE,           P.DRAINING,         "the outcome overtook the ticket"),
        (P.WAITING_POOL,     E.PREFILLED,          P.PREFILLING,       "-"),
        (P.PREFILLING,       E.PAGES_GRANTED,      P.TRANSFERRING,     "PageWrite per page, then TransferDone"),
        (P.WAITING_POOL,     E.FINALIZE,           P.DRAINING,         "never posts a write"),
        (P.PREFILLING,       E.FINALIZE,           P.DRAINING,         "never posts a write"),
        (P.TRANSFERRING,     E.FINALIZE,           P.DRAINING,         "posts no more; writes may be in flight"),
        (P.DRAINING,         E.QUIESCED,           P.DONE,             "DrainAck to decode"),
        # The engine ended the prompt (an error) before handing it over.
        (P.WAITING_POOL,     E.QUIESCED,           P.DONE,             "ended before the hand-over: nothing written"),
        # The success path: every write was posted at once, so once they
        # have all ended none is outstanding and none will be posted; the
        # router sends no Finalize after a success, so this is the ack.
        (P.TRANSFERRING,     E.QUIESCED,           P.DONE,             "DrainAck as the writes end"),
        # A transfer that failed with a write still in flight (a timeout):
        # no ack, ever; decode's lease fences the write.
        (P.TRANSFERRING,     E.UNDRAINED,          P.DONE,             "a write may still land: never acked"),
        (P.DRAINING,         E.UNDRAINED,          P.DONE,             "a write may still land: never acked"),
    ),
    DECODE: (
        (NEW,                E.ASSIGN,             P.WAITING_PAGES,    "-"),
        (NEW,                E.FINALIZE,           P.DONE,             "the outcome overtook the ticket"),
        (P.WAITING_PAGES,    E.PAGES_GRANTED,      P.DECODE_ALLOCATED, "PagesGranted(pages, gens) to prefill"),
        # A reservation may be in flight on the engine thread: the job
        # waits for the ack or the lease, as if granted.
        (P.WAITING_PAGES,    E.FINALIZE,           P.DRAINING,         "waits for the ack or lease, as if granted"),
        (P.DECODE_ALLOCATED, E.MANIFEST_VERIFIED,  P.COMMITTED,        "-"),
        # A check that fails: no commit can follow, so drain now, not at
        # the router's Finalize (which its TransferFailed brings).
        (P.DECODE_ALLOCATED, E.VERIFY_FAILED,      P.DRAINING,         "reports TransferFailed, drains now"),
        (P.COMMITTED,        E.DECODE_STEP,        P.DECODING,         "tokens to the router"),
        # The success path: the last token frees the pages at once. No drain
        # wait: the commit came after every write had landed, and no write
        # is admitted after it (manifest.write_admissible).
        (P.DECODING,         E.FINISHED,           P.DONE,             "Output (finished) to the router; pages freed"),
        (P.DECODE_ALLOCATED, E.FINALIZE,           P.DRAINING,         "holds pages a writer may reach"),
        # A committed request has no finalize row: it is the engine's to
        # end (decode_job.finalize aborts it there), through FINISHED.
        (P.DRAINING,         E.DRAIN_ACK,          P.DONE,             "pages scrubbed and freed"),
        (P.DRAINING,         E.LEASE_EXPIRED,      P.DONE,             "pages scrubbed and freed"),
    ),
}


@dataclass(frozen=True)
class Row:
    actor: Actor
    src: P | None
    event: Event
    dst: P
    why: str


class IllegalTransition(Exception):
    """A phase change that is not in the table: a bug, or a message the
    protocol never sends (a duplicate the guards should have dropped)."""

    def __init__(self, actor: Actor, phase: P | None, event: Event):
        super().__init__(f"{actor.value}: no transition from {_name(phase)} on {event.value} in the protocol table")
        self.actor, self.phase, self.event = actor, phase, event


_ROWS = tuple(Row(actor, *row) for actor, table in PROTOCOL.items() for row in table)
_TABLE = {(r.actor, r.src, r.event): r.dst for r in _ROWS}


def advance(actor: Actor, phase: P | None, event: Event) -> P:
    """The phase after `event`; IllegalTransition if the table has no row."""
    to = _TABLE.get((actor, phase, event))
    if to is None:
        raise IllegalTransition(actor, phase, event)
    return to


def rows() -> tuple[Row, ...]:
    """Every row of the table, in table order."""
    return _ROWS


def format_table() -> str:
    """The table as docs/verification.md shows it."""
    lines = [f"{'actor':8} {'from':17} {'event':18} {'to':17} sends, or why",
             f"{'-' * 7:8} {'-' * 16:17} {'-' * 17:18} {'-' * 16:17} {'-' * 13}"]
    for row in _ROWS:
        lines.append(f"{row.actor.value:8} {_name(row.src):17} {row.event.value:18} {row.dst.name:17} {row.why}")
    return "\n".join(lines)


def _name(phase: P | None) -> str:
    return "-" if phase is None else phase.name


class Phased:
    """A runtime record (route or job) whose phase changes only through the
    table. Subclasses are dataclasses with a `phase` field."""

    actor: ClassVar[Actor]
    phase: P | None

    def advance(self, event: Event) -> P:
        self.phase = advance(self.actor, self.phase, event)
        return self.phase

    def take(self, step):
        """Take a transition function's step (bulkhead.protocol.*_job, which
        change phases through this table): its phase becomes the record's."""
        self.phase = step.phase
        return step
