"""What one engine step computes: the scheduler's plan, handed to the model
runner. Only ids and ints (no tensors, no torch): the runner alone turns it
into tensors, and scheduler tests build and read it without a model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrefillWork:
    request_id: str
    tenant: str
    start: int  # first position computed in this pass
    token_ids: tuple[int, ...]  # tokens at positions [start, start + len)
    pages: tuple[int, ...]  # every page the request owns, in position order
    samples: bool  # the chunk ends the sequence: sample the next token
    all_logits: bool = False  # logits for every row, not only the sampling one (prompt logprobs)
    # The layers [first, stop) this step runs of the chunk's pass, or None for
    # the whole pass (bulkhead.engine.pass_slices); its logits, samples and
    # progress come only with the slice that ends the pass.
    layers: tuple[int, int] | None = None
    ends_pass: bool = True
    adapter: str | None = None  # the digest of the request's LoRA adapter (bulkhead.engine.adapter_store)

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)


@dataclass(frozen=True)
class DecodeWork:
    request_id: str
    tenant: str
    position: int
    token_id: int
    pages: tuple[int, ...]
    adapter: str | None = None  # as PrefillWork's


@dataclass(frozen=True)
class StepPlan:
    """prefills: one pass per chunk (a single PrefillWork or None is accepted
    and made a tuple, for callers that plan one chunk by hand)."""

    prefills: tuple[PrefillWork, ...]
    decode: tuple[DecodeWork, ...]
    preempted: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.prefills is None:
            object.__setattr__(self, "prefills", ())
        elif isinstance(self.prefills, PrefillWork):
            object.__setattr__(self, "prefills", (self.prefills,))

    @property
    def request_ids(self) -> list[str]:
        return [w.request_id for w in self.prefills] + [w.request_id for w in self.decode]

    @property
    def num_tokens(self) -> int:
        return sum(len(w.token_ids) for w in self.prefills) + len(self.decode)
