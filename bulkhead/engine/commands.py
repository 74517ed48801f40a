"""What other threads ask of the engine thread, one frozen type each.

Only the engine thread touches the scheduler, the ledger and the pool
(docs/architecture.md names the two exceptions). Other threads enqueue a
command; the engine applies it between steps. A command that answers
carries a Future the engine resolves.

    command           from                    what the engine does
    ----------------  ----------------------  ---------------------------------------------
    Add               HTTP thread, prefill    queue an admitted request
    Abort             HTTP thread, workers    end a request (finished, aborted) and free its pages
    StartPrefilled    decode (link thread)    start decoding a request whose verified KV sits
                                              in pages it reserved
    Reserve           decode (link thread)    pages for a request whose KV will be written by
                                              a remote writer: (pages, generations), or None
                                              when the pool has no room now
    ReleaseReserved   workers                 give back, scrubbed, what Reserve or a
                                              prefill-only hand-over kept
    ReadPages         decode (link thread)    owners, generations and digests of reserved pages,
                                              for the coverage check before a commit
    Call              tests, tools, workers   run a function on the engine thread; workers
                      (link thread)           tell tenants' shares and copy the fair queue's
                                              figures this way (disagg/engine_channel.py)
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass


@dataclass(frozen=True)
class Add:
    ticket: object          # engine.admission.Admitted
    sink: Callable


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class StartPrefilled:
    ticket: object          # engine.admission.Admitted
    first_token: int
    first_logprobs: object  # engine.sampler.TokenLogprobs | None
    sampler_state: bytes | None
    sink: Callable
    prompt_logprobs: tuple = ()  # echo's, computed by prefill (engine.outputs.TokenLogprobs)


@dataclass(frozen=True)
class Reserve:
    request_id: str
    tenant: str
    num_pages: int
    result: Future          # -> (pages, generations) | None


@dataclass(frozen=True)
class ReleaseReserved:
    request_id: str


@dataclass(frozen=True)
class ReadPages:
    """Facts about pages a request holds, read where the pool is written."""
    request_id: str
    pages: tuple[int, ...]
    digests: bool           # False: guards off (benchmark only), no hashing
    result: Future          # -> PageFacts


@dataclass(frozen=True)
class PageFacts:
    owners: tuple[str | None, ...]
    generations: tuple[int, ...]
    digests: tuple[int, ...] | None


@dataclass(frozen=True)
class Call:
    fn: Callable[[], object]
    result: Future


@dataclass(frozen=True)
class Wake:
    """stop(): unblock a waiting engine thread."""
