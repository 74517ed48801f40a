"""The interface every prepared linear layer has (bulkhead.model.linear_kernel
for the layers' kernels, bulkhead.model.head_linear for the lm_head's)."""

from __future__ import annotations

import torch


class Linear:
    """One linear layer's weight, prepared for a kernel: `layer(x, b,
    decode)` is x @ w.T + b in x's dtype. `decode` says the rows are decode
    rows (one per request), which some kernels run differently; a caller
    must pass it by phase, never by row count, so that a request's kernel
    does not depend on how many others share its step."""

    out_features: int
    in_features: int

    def __call__(self, x: torch.Tensor, b: torch.Tensor | None = None, decode: bool = False) -> torch.Tensor:
        raise NotImplementedError

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """For a fused gate_up layer [2 I, D] (gate's outputs, then up's):
        silu(gate) * up of prompt rows x in one pass, where this layer's
        prompt kernel has one; None where it has not (the caller runs the
        layer, then the product). Its dtype is the one the same kernel's
        down projection reads without a further rounding (bf16 from the
        bf16-input prompt kernel); every layer of a model shares a kernel."""
        return None
