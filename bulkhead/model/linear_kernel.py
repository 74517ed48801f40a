"""Which kernel runs the linear layers: oneDNN over weights reordered once at
load, or PyTorch's default (`F.linear`, MKL's sgemm on x86 builds).

Why oneDNN: on this project's 2-core AMD EPYC machine MKL's sgemm runs the
whole model's linear layers 3.7x slower at 4 rows (49 vs 13 ms per decode
step, weights cycling through memory) and 2-2.5x slower at prefill sizes than
oneDNN's kernel over a weight laid out for it ahead of time, which is also
what vLLM's CPU build runs. The reorder is done once per weight when the
model is built; the laid-out copy replaces the plain one, so it costs no
memory (except a tied lm_head, whose embedding stays for token lookup).

Batch invariance is not assumed of either kernel: the engine measures at
start-up, through `linear` below, which decode row counts give a row the
same numbers whatever its batch-mates (bulkhead.model.row_invariance).
"""

from __future__ import annotations

import dataclasses
import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

KERNELS = ("auto", "onednn", "aten")

# The row count oneDNN lays a weight out for; any count runs on it. Measured
# here with the check of bulkhead.model.row_invariance over the model's
# shapes, hints 1, 4 and 16 all give R = 2 (a 1-row result differs from the
# same row in a bigger batch); 16 is the decode batch this is tuned for.
ROWS_HINT = 16


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T + b, by whichever kernel the weight was prepared for."""
    if w.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
    return F.linear(x, w, b)


def onednn_usable(dtype: torch.dtype) -> bool:
    """This torch build has oneDNN and it runs a reordered linear of this dtype."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        w = torch.ops.mkldnn._reorder_linear_weight(torch.ones(8, 8, dtype=dtype), ROWS_HINT)
        y = linear(torch.ones(2, 8, dtype=dtype), w)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return bool(torch.all(y == 8))


def choose(kernel: str, dtype: torch.dtype) -> str:
    """Resolve "auto" to a kernel this build can run."""
    if kernel not in KERNELS:
        raise ValueError(f"linear kernel must be one of {KERNELS}, not {kernel!r}")
    if kernel == "aten":
        return "aten"
    if onednn_usable(dtype):
        return "onednn"
    if kernel == "onednn":
        raise RuntimeError("--linear-kernel onednn: this torch build cannot run oneDNN linear layers")
    log.info("oneDNN linear layers unavailable in this torch build; using F.linear")
    return "aten"


def lay_out(w: torch.Tensor) -> torch.Tensor:
    """A [out, in] weight laid out for oneDNN's linear (an opaque mkldnn tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), ROWS_HINT)


def prepare(weights, kernel: str):
    """The model's weights with every linear layer's laid out for `kernel`
    (a ModelWeights; returned as a new one, the input is not changed)."""
    if kernel == "aten":
        return weights
    if kernel != "onednn":
        raise ValueError(f"prepare() takes a chosen kernel, aten or onednn, not {kernel!r} (see choose())")
    layers = [dataclasses.replace(layer, qkv=lay_out(layer.qkv), o=lay_out(layer.o),
                                  gate_up=lay_out(layer.gate_up), down=lay_out(layer.down))
              for layer in weights.layers]
    return dataclasses.replace(weights, layers=layers, lm_head=lay_out(weights.lm_head))
