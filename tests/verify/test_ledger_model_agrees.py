"""The checker's page ledger (verify/actors/ledger_model.py) and the runtime's
(kv/ledger.py) are two codes for one allocator: replay the same random
operation sequences through both and require the same answers.

Page ids may differ (the model numbers its pool from the other end), so the
test pairs the pages the two hand out in the same operation and requires
that pairing to stay one bijection: a model page is always the same runtime
page, so both reuse the same freed page at the same moment, in the same
order (newest freed first, a released block coming back in its old order:
the incident's worst case). Generations, owners and free counts must agree
under it, and both integrity checks must hold after every step.
"""

import random

import pytest

from bulkhead.kv.ledger import OutOfPages, PageLedger
from bulkhead.verify.actors.ledger_model import Ledger

POOL = 12
SEQUENCES = 2000
STEPS = 40


class Pairing:
    def __init__(self):
        self.to_runtime: dict[int, int] = {}
        self.to_model: dict[int, int] = {}

    def pair(self, model_page: int, runtime_page: int) -> None:
        known = self.to_runtime.get(model_page), self.to_model.get(runtime_page)
        if known == (None, None):
            self.to_runtime[model_page], self.to_model[runtime_page] = runtime_page, model_page
        elif known != (runtime_page, model_page):
            raise AssertionError(f"model page {model_page} handed out with runtime page {runtime_page}, "
                                 f"but it was paired with {known[0]} (runtime {runtime_page} with {known[1]})")


def replay(seed: int) -> None:
    rng = random.Random(seed)
    model, runtime, pairing = Ledger.fresh(POOL), PageLedger(POOL), Pairing()
    held: dict[int, tuple[int, ...]] = {}  # rid -> the model's pages, in allocation order
    next_rid = 0
    for _ in range(STEPS):
        if held and (rng.random() < 0.45 or not model.free):
            rid = rng.choice(sorted(held))
            model = model.release(held.pop(rid), scrub=True)
            runtime.release(str(rid))
            runtime.mark_scrubbed(runtime.dirty_pages())  # scrub_released: the pool zeroes them, then reuse
        else:
            count = rng.randint(1, 4)
            rid, next_rid = next_rid, next_rid + 1
            if count > len(model.free):
                with pytest.raises(OutOfPages):
                    runtime.allocate(str(rid), "t", count)
                continue
            model, pages = model.allocate(rid, count)
            runtime_pages = runtime.allocate(str(rid), f"t{rid % 3}", count)
            for m, r in zip(pages, runtime_pages, strict=True):
                pairing.pair(m, r)
            held[rid] = pages
        model.check_integrity()
        runtime.check_integrity(live_requests={str(r) for r in held})
        assert len(model.free) == runtime.num_free
        for m, r in pairing.to_runtime.items():
            entry = model.entries[m]
            assert entry.gen == runtime.generation(r), (seed, m, r)
            assert (None if entry.owner is None else str(entry.owner)) == runtime.record(r).owner, (seed, m, r)


def test_the_model_ledger_and_the_runtime_ledger_agree_on_random_sequences():
    for seed in range(SEQUENCES):
        replay(seed)


def test_the_replay_would_see_a_different_reuse_order(monkeypatch):
    # The check can fail: a runtime that puts a released block back in the
    # other order (the oldest freed page first) breaks the pairing.
    original = PageLedger.mark_scrubbed

    def reversed_order(self, pages):
        original(self, list(reversed(pages)))

    monkeypatch.setattr(PageLedger, "mark_scrubbed", reversed_order)
    with pytest.raises(AssertionError, match="paired with"):
        for seed in range(SEQUENCES):
            replay(seed)
