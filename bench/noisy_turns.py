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
or at once while the decode engine steps (a waiting worker takes commands).
Its time to first token runs to the decode engine's first output: the
hand-off (grant, copy, checks, first output) runs on the decode worker's
engine thread, which takes commands only between its steps or while it
waits for the cores. So a hand-off goes through beside the prefill step it
was handed over in when that step went on --hand-off-s longer (its
messages' wall time; a slice runs after the step's other passes), else at
the start of the prefill engine's next step in the same turn, else after
the decode engine's next step (at once when that engine has no work).

Variants, request by request on one flood: `hand-off-turn` (as built: a
turn that handed an idle tenant's first token over at its end keeps one
more step, Engine._step_in_turn), `slice-128` (the same with the parent's
128-token slices of a long pass, not SchedulerConfig.slice_tokens' 64; the
pass in flight is re-sized at each switch), `keep-turn` (a short prompt
of another tenant that came during the prefill engine's step runs in the
same turn) and `alternate` (turns strictly alternate). Prints each
variant's light median and p99 time to first token alone and flooded, the
heavy tenant's output tokens per CPU second while each variant's requests
ran, and the hand-off's share of the light time to first token.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.noisy_clock import Flood, interleaved, parser, report, slice_budget  # noqa: E402
from bulkhead.engine.admission import admit  # noqa: E402
from bulkhead.engine.builder import EngineConfig, build_engine  # noqa: E402
from bulkhead.engine.request import SamplingParams  # noqa: E402
from bulkhead.model.gguf_import import default_model_dir  # noqa: E402

VARIANTS = ("hand-off-turn", "slice-128", "keep-turn", "alternate")


class Turns(Flood):
    """The two engines, a virtual clock over their steps, the flood and the light tenant."""

    def __init__(self, args, rng: random.Random):
        self.args, self.rng = args, rng
        cfg = EngineConfig(model_dir=default_model_dir(), model_id="bench",
                           kv_memory_bytes=int(args.kv_memory_gib * 2**30), clamp_context_length=True)
        self.pre = build_engine(cfg, prefill_only=True)
        self.dec = build_engine(cfg, decode_only=True)
        self.now, self._start = 0.0, None
        self.first: dict[str, float] = {}  # the decode engine's first output, after the hand-off
        self.handed: dict[str, float] = {}  # the prefill engine's first token
        self._handing: list = []  # (ticket, hand-over, when) not yet taken by the decode engine
        self.done: set[str] = set()
        self.heavy_tokens = 0
        self.keep_turn = True
        self.hand_off_turn = True  # the turn keeps one more step after a hand-over (Engine._step_in_turn)
        self.variant = VARIANTS[0]
        self.hand_offs: dict[tuple[str, bool], list[float]] = {}  # (variant, flooded) -> first - handed
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
        self.handed.setdefault(rid, self.read())
        self._handing.append((ticket, out, self.read()))

    def _take_hand_offs(self, beside: bool = False) -> None:
        """The decode engine takes the hand-offs waiting for it (grant,
        commit, first output), as its worker does between its steps and
        while it waits for the cores. beside: after a prefill step, those
        it handed over at least --hand-off-s before it ended, which went
        through while the step went on (their first output at that time)."""
        taken = [h for h in self._handing if not beside or h[2] + self.args.hand_off_s <= self.now]
        for ticket, out, _ in taken:
            rid = ticket.request_id
            self.pre.engine.release_reserved(rid)
            pages = self.dec.layout.pages_for_tokens(len(ticket.prompt_token_ids))
            self.dec.engine.reserve(rid, ticket.tenant, pages)
            self.dec.engine.submit_prefilled(ticket, out.token_ids[0], None, None, lambda o, r=rid: self._decoded(r, o))
            self._handing.remove((ticket, out, _))
        self.dec.engine._take_commands(block=False)
        for ticket, _, when in taken:  # a hand-off's first output, its messages' time after it was free to go
            hop = when + self.args.hand_off_s
            self.first[ticket.request_id] = hop if beside else max(self.now, hop)

    def _decoded(self, rid: str, out) -> None:
        self.first.setdefault(rid, self.read())
        if rid.startswith("heavy"):
            self.heavy_tokens += len(out.token_ids)
        if out.finished:
            self.done.add(rid)

    def step(self) -> None:
        """The next step of the turns: the prefill engine's, its second and
        third in the same turn where it keeps it (Engine._step_in_turn), the
        decode engine's. Each engine takes its commands before its step. A
        hand-off is taken where the decode worker takes commands: at the
        start of a prefill step (it waits for the cores meanwhile), after a
        decode step, or at once when the decode engine has no work. A
        hand-off that the prefill engine's turn ended with lands during the
        decode engine's next step (its messages take longer than the turn's
        change) and waits for its end, as served."""
        pre, dec = self.pre.engine, self.dec.engine
        order = {"pre": "again", "again": "hand-off", "hand-off": "dec", "dec": "pre"}
        phase, self._phase = self._phase, order[self._phase]
        if phase == "pre":
            pre._handed_first = False
        engine = dec if phase == "dec" else pre
        engine._take_commands(block=False)
        if phase == "again" and not (self.keep_turn and pre.scheduler.planner.first_token_waits()):
            return
        if phase == "hand-off" and not (self.hand_off_turn and pre._handed_first):
            return
        if phase == "dec" and not dec.scheduler.has_work():
            self._take_hand_offs()
        if engine.scheduler.has_work():
            if phase != "dec":
                self._take_hand_offs()
            self._step(engine)
            if phase != "dec":
                self._take_hand_offs(beside=True)
        if phase == "dec":
            self._take_hand_offs()

    def light(self, streams: list[str]) -> tuple[float, float]:
        """Flood.light, keeping the hand-off's share of its time to first token."""
        ttft, took = super().light(streams)
        rid = max((r for r in self.first if r.startswith("light")), key=lambda r: int(r.split("-")[1]))
        self.hand_offs.setdefault((self.variant, bool(streams)), []).append(self.first[rid] - self.handed[rid])
        return ttft, took

    def time(self) -> float:
        return self.now

    def idle(self) -> bool:
        return not (self.pre.engine.has_pending() or self.dec.engine.has_pending())


def main(argv=None) -> int:
    ap = parser()
    ap.set_defaults(variants=",".join(VARIANTS))
    ap.add_argument("--hand-off-s", type=float, default=0.01,
                    help="a hand-off's messages and copy, in wall time: one handed over this long before the "
                         "prefill engine's step ends goes through beside it")
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    torch.set_num_threads(args.threads)
    b = Turns(args, random.Random(args.seed))

    def choose(v: str) -> None:
        b.variant, b.keep_turn, b.hand_off_turn = v, v != "alternate", v in ("hand-off-turn", "slice-128")
        slice_budget(b.pre.engine.scheduler, 128 if v == "slice-128" else b.pre.engine.scheduler.config.slice_tokens)

    report(args, ", prefill and decode engines taking turns", variants,
           *interleaved(b, args, variants, choose))
    print("of which the hand-off (prefill engine's first token to the decode engine's), median s:")
    for v in variants:
        alone, flooded = (statistics.median(b.hand_offs.get((v, f), [0.0])) for f in (False, True))
        print(f"  {v:<18} alone {alone:.3f}  flooded {flooded:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
