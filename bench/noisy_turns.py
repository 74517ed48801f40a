"""Noisy neighbour on the default deployment's two engines, on a clock of CPU time.

    python bench/noisy_turns.py                       # 24 x 1600-token prompts, 200 out (issue 14's flood)
    python bench/noisy_turns.py --heavy-streams 12 --heavy-prompt-tokens 1000 --heavy-output-tokens 100  # quicker

`--role local` runs a prefill and a decode worker whose steps take turns
with the host's cores (engine/core_lease.py). This drives both engines,
built as the workers build them, on the calling thread, turn by turn, with
bench/noisy_clock.py's virtual clock (the CPU time of the steps): the
prefill engine's step, then the decode engine's, and so on while both have
work. A prompt handed over by the prefill engine decodes on the decode
engine from pages reserved there (their KV is not copied: a decode step's
cost does not depend on the values it reads). A light request arrives a
random time after the last one; the prefill engine takes it after its step,
or at once while the decode engine steps (a waiting worker takes commands),
and its time to first token runs to the CPU time at which the prefill
engine emitted it. The hand-off to the decode worker after that is left
out: it is the same in both variants (it runs beside the prefill worker's
next slice, while the decode engine waits for the cores).

Variants, request by request on one flood: `keep-turn` (as built: a short
prompt of another tenant that came during the prefill engine's step runs in
the same turn, Engine._step_in_turn) and `alternate` (turns strictly
alternate, the parent). Prints each variant's light median and p99 time to
first token alone and flooded, and the heavy tenant's output tokens per CPU
second while each variant's requests ran.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.noisy_clock import Flood, interleaved, parser, report  # noqa: E402
from bulkhead.engine.admission import admit  # noqa: E402
from bulkhead.engine.builder import EngineConfig, build_engine  # noqa: E402
from bulkhead.engine.request import SamplingParams  # noqa: E402
from bulkhead.model.gguf_import import default_model_dir  # noqa: E402

VARIANTS = ("keep-turn", "alternate")


class Turns(Flood):
    """The two engines, a virtual clock over their steps, the flood and the light tenant."""

    def __init__(self, args, rng: random.Random):
        self.args, self.rng = args, rng
        cfg = EngineConfig(model_dir=default_model_dir(), model_id="bench",
                           kv_memory_bytes=int(args.kv_memory_gib * 2**30), clamp_context_length=True)
        self.pre = build_engine(cfg, prefill_only=True)
        self.dec = build_engine(cfg, decode_only=True)
        self.now, self._start = 0.0, None
        self.first: dict[str, float] = {}
        self.done: set[str] = set()
        self.heavy_tokens = 0
        self.keep_turn = True
        self._phase = "pre"  # whose step is next (step())
        self._ids = iter(range(10**9))
        self.vocab = self.pre.engine.runner.model.config.vocab_size

    def read(self) -> float:
        return self.now + (time.thread_time() - self._start if self._start is not None else 0.0)

    def _step(self, engine) -> None:
        self._start = time.thread_time()
        try:
            engine.step()
        finally:
            self.now, self._start = self.read(), None

    def submit(self, tenant: str, tokens: int, max_tokens: int) -> str:
        rid = f"{tenant}-{next(self._ids)}"
        ids = [self.rng.randrange(1000, min(self.vocab, 30000)) for _ in range(tokens)]
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        ticket = admit(rid, tenant, ids, params, self.pre.limits)
        self.pre.engine.submit(ticket, lambda out: self._handed_over(ticket, out))
        return rid

    def _handed_over(self, ticket, out) -> None:  # the prefill engine's sink
        rid = ticket.request_id
        if out.finish_reason != "prefilled":
            raise RuntimeError(f"{rid}: {out.finish_reason} {out.error}")
        self.first.setdefault(rid, self.read())
        self.pre.engine.release_reserved(rid)
        pages = self.dec.layout.pages_for_tokens(len(ticket.prompt_token_ids))
        self.dec.engine.reserve(rid, ticket.tenant, pages)
        self.dec.engine.submit_prefilled(ticket, out.token_ids[0], None, None, lambda o: self._decoded(rid, o))

    def _decoded(self, rid: str, out) -> None:
        if rid.startswith("heavy"):
            self.heavy_tokens += len(out.token_ids)
        if out.finished:
            self.done.add(rid)

    def step(self) -> None:
        """The next step of the turns: the prefill engine's, its second one in
        the same turn where it keeps it (Engine._step_in_turn), the decode
        engine's. Each engine takes its commands before its step."""
        pre, dec = self.pre.engine, self.dec.engine
        phase, self._phase = self._phase, {"pre": "again", "again": "dec", "dec": "pre"}[self._phase]
        engine = dec if phase == "dec" else pre
        engine._take_commands(block=False)
        if phase == "again" and not (self.keep_turn and pre.scheduler.planner.first_token_waits()):
            return
        if engine.scheduler.has_work():
            self._step(engine)

    def time(self) -> float:
        return self.now

    def idle(self) -> bool:
        return not (self.pre.engine.has_pending() or self.dec.engine.has_pending())


def main(argv=None) -> int:
    ap = parser()
    ap.set_defaults(variants=",".join(VARIANTS))
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    torch.set_num_threads(args.threads)
    b = Turns(args, random.Random(args.seed))

    def choose(v: str) -> None:
        b.keep_turn = v == "keep-turn"

    report(args, ", prefill and decode engines taking turns", variants,
           *interleaved(b, args, variants, choose))
    return 0


if __name__ == "__main__":
    sys.exit(main())
