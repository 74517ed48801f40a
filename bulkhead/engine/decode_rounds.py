"""Decode rows in rounds, a step's rows within its latency budget. Pure Python.

A prompt that arrives while a step runs waits for that step to end, so no
step should be much longer than a latency budget, whoever waits when it is
planned. A long prompt pass is cut into slices of layers (pass_slices.py);
a large decode batch over long contexts is the other long step, so its
rows run in rounds: each round's rows split into as few equal groups, one
a step, as keep each group within SchedulerConfig.decode_step_tokens.

Cost model (one thread, the bundled SmolLM2, bench/noisy_clock.py's load):
a decode row costs about 2 prompt tokens plus one per 512 positions it
reads, so 24 rows of 1,700 positions are ~120 tokens: two groups of 12
under a 64-token budget. Each extra group adds one step's fixed cost (a few
ms against ~80 ms).

Invariant: rows run least recently run first, so with G groups a decoding
request waits at most G - 1 steps that carry decode rows for its next row.
"""

from __future__ import annotations

from bulkhead.engine.request import Request


def row_cost(req: Request) -> int:
    """Tokens of a prompt pass that one decode row of req costs (module docstring)."""
    return 2 + req.num_computed // 512


class DecodeRounds:
    def __init__(self, budget: int):
        """budget: the most tokens of a whole pass a step's rows cost; 0 = one group always."""
        self.budget = budget
        self._last: dict[str, int] = {}  # request id -> the step (of ran()'s count) its last row ran in
        self._steps = 0

    def group(self, ready: list[Request]) -> list[Request]:
        """One group's worth of ready (every decoding request, in planning
        order), least recently run first (one never run before all), in planning order."""
        live = {r.request_id for r in ready}
        self._last = {rid: step for rid, step in self._last.items() if rid in live}  # the ended leave
        size = self.group_size(ready)
        if size >= len(ready):
            return list(ready)
        due = sorted(range(len(ready)), key=lambda i: (self._last.get(ready[i].request_id, -1), i))
        return [ready[i] for i in sorted(due[:size])]

    def group_size(self, ready: list[Request]) -> int:
        """Rows per step that split the round into as few groups as fit the budget."""
        if self.budget <= 0 or not ready:
            return len(ready)
        groups = -(-sum(row_cost(r) for r in ready) // self.budget)
        return -(-len(ready) // groups)

    def ran(self, request_ids: list[str]) -> None:
        """These rows ran (a row planned and then deferred did not: it stays due)."""
        self._steps += 1
        for rid in request_ids:
            self._last[rid] = self._steps
