"""Where a prompt pass's time goes: each part's own time (a part called from
inside another counts to itself, not to its caller), as bench/prompt_step.py
--parts prints it.

Parts: `linears` (every linear layer but the lm_head, gate_up's fused SiLU
included), `attention` (the prompt attention, the KV write's torch path
included), `kv write` (the C write of K and V into the pool), `glue`
(norms, rotary, SiLU where it runs apart), `head` (final norm and lm_head)
and `rest`: the step's time outside all of them (Python between the layers,
the runner's batch building). The timers wrap the functions the model looks
up at call time, so the pass runs as it does in the engine.

The linears' rate is their multiply-adds (2 x rows x the layers' weights)
over their time, set beside the same kernel's rate on a hot-cache layer
(`hot_rate`): the share of the dot product's peak a pass gets, not only how
long it takes.
"""

from __future__ import annotations

import collections
import contextlib
import time

import torch

from bulkhead.model import llama, prefill_attention

PARTS = ("linears", "attention", "kv write", "glue", "head", "rest")
_GLUE = ("rms_norm", "rope", "add_rms_norm", "silu_mul")


class PartTimer:
    """Exclusive time per part while `installed()`, on `clock` (what the step is timed on)."""

    def __init__(self, clock=time.thread_time):
        self.clock = clock
        self.spent = collections.Counter()
        self._stack: list[list] = []  # [part, start, time spent in parts called from it]

    def wrap(self, fn, part: str, opaque: bool = False):
        """fn timed as `part`; opaque: the parts it calls count to it (the lm_head's linear to `head`)."""
        def timed(*args, **kwargs):
            if self._stack and self._stack[-1][0] is None:  # inside an opaque part
                return fn(*args, **kwargs)
            self._stack.append([part, self.clock(), 0.0])
            if opaque:
                self._stack.append([None, 0.0, 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                if opaque:
                    self._stack.pop()
                name, start, inner = self._stack.pop()
                elapsed = self.clock() - start
                self.spent[name] += elapsed - inner
                if self._stack:
                    self._stack[-1][2] += elapsed
        return timed

    @contextlib.contextmanager
    def installed(self):
        """The model's functions wrapped for the block's duration, then put back."""
        targets = [(llama, "_linear", "linears", False), (llama, "paged_attention", "attention", False),
                   (prefill_attention, "write_kv", "kv write", False),
                   (llama.LlamaModel, "_head", "head", True)]
        for glue in (llama._CGlue, llama._TorchGlue):
            targets.append((glue, "gate_up_silu_mul", "linears", False))
            targets += [(glue, name, "glue", False) for name in _GLUE]
        saved = [(owner, name, owner.__dict__[name]) for owner, name, _, _ in targets]
        try:
            for owner, name, part, opaque in targets:
                setattr(owner, name, self.wrap(owner.__dict__[name], part, opaque))
            yield self
        finally:
            for owner, name, fn in saved:
                setattr(owner, name, fn)


def linear_flops(config, rows: int) -> float:
    """Multiply-adds x 2 of a pass's linear layers (not the lm_head) over `rows` rows."""
    per_layer = (config.q_size + 2 * config.kv_size) * config.hidden_size + config.q_size * config.hidden_size \
        + 3 * config.intermediate_size * config.hidden_size
    return 2.0 * rows * per_layer * config.num_layers


def hot_rate(layer, rows: int, reps: int = 10, clock=time.thread_time) -> float:
    """GFLOP/s of `layer` (a prepared Linear) on `rows` rows with its weight
    and input in cache: the best of `reps` calls, as a reference peak."""
    x = torch.randn(rows, layer.in_features)
    with torch.inference_mode():
        layer(x)
        best = float("inf")
        for _ in range(reps):
            start = clock()
            layer(x)
            best = min(best, clock() - start)
    return 2.0 * rows * layer.in_features * layer.out_features / best / 1e9
