"""Layer slices: how a long prefill pass shares the cores with other tenants.

A 512-token chunk of SmolLM2 is a pass of a few hundred milliseconds; run
whole, it makes another tenant's short prompt, and every decoding request's
next token, wait it out. So the scheduler hands such a pass out a slice of
layers per engine step (chunk_planning.py says when), beside everyone's
decode rows and other tenants' short prompts. The runner keeps the pass's
hidden rows between slices; nothing re-enters the engine, and the pass
computes exactly the numbers it would have run whole (the same ops, layer
after layer), so batch invariance holds.

Safety, all enforced by the scheduler (Scheduler.check_integrity checks it):
- at most one pass is in flight, and its request is never preempted and never
  planned a new chunk while its pass is in flight: its pages and positions
  are the ones its first slice was planned with;
- its pages are allocated for the whole chunk before the first slice runs;
- a request that ends while its pass is in flight (abort, a failed step)
  leaves no paused state: the engine drops the runner's copy at once.

Invariant: a pass in flight holds layers [0, next_layer) computed.

    |-- slice 0 --|-- slice 1 --|-- ... --|-- last slice --|
    0           per          2*per     num_layers
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bulkhead.engine.step_plan import PrefillWork


def layers_per_slice(num_layers: int, chunk_tokens: int, slice_tokens: int) -> int:
    """Layers a slice runs so that it costs about slice_tokens tokens of a
    whole pass (a pass's cost grows with its rows times its layers);
    num_layers when the chunk is short enough to run whole."""
    if slice_tokens <= 0 or chunk_tokens <= slice_tokens:
        return num_layers
    return max(1, num_layers * slice_tokens // chunk_tokens)


@dataclass
class InFlightPass:
    """A prefill chunk whose pass runs slice by slice (the module docstring)."""

    work: PrefillWork  # the whole chunk, as planned (layers unset)
    per_slice: int  # layers each slice runs (the last may run fewer)
    num_layers: int
    next_layer: int = 0  # layers [0, next_layer) have run

    def next_slice(self) -> PrefillWork:
        """The chunk's work for its next slice: layers [next_layer, stop)."""
        stop = min(self.next_layer + self.per_slice, self.num_layers)
        return replace(self.work, layers=(self.next_layer, stop), ends_pass=stop == self.num_layers)

    def ran(self, work: PrefillWork) -> bool:
        """Record that work (a slice of this pass) ran; True when the pass is done."""
        if work.layers is None or work.layers[0] != self.next_layer:
            raise AssertionError(f"{work.request_id}: slice {work.layers} ran, layer {self.next_layer} expected")
        self.next_layer = work.layers[1]
        return self.next_layer == self.num_layers
