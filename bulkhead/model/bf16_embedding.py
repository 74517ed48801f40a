"""The token embedding of a bf16 checkpoint, held in bf16 and looked up as
fp32 rows (the bf16 values widened exactly, so every lookup equals the
fp32 embedding's).

Why: the loader keeps a bf16 checkpoint's matrices as stored
(loader.held_as_stored); an fp32 copy of the embedding for token lookup
would double it (a 1B model's 49152 x 2048: 400 MB against 200 MB). Where
the embedding is tied to the lm_head and the lm_head runs `bf16-in`, rows
are read from the lm_head's packing (bf16in_kernel.pack), so the model
holds the matrix once.
"""

from __future__ import annotations

import torch

from bulkhead.model import bf16in_kernel

NB = bf16in_kernel.BLOCK  # vocabulary rows per packed block


class BF16Embedding:
    """`embedding[token_ids]` -> fp32 rows [..., D] of bf16 weights."""

    dtype = torch.float32

    def __init__(self, rows: torch.Tensor | None = None, pairs: torch.Tensor | None = None):
        """rows: [V, D] bf16 (held as given); or pairs: bf16in_kernel.pack's [V / NB, D / 2, NB, 2]."""
        if (rows is None) == (pairs is None):
            raise ValueError("BF16Embedding takes rows or the lm_head's packed pairs, one of them")
        self.rows, self.pairs = rows, pairs
        self.shape = rows.shape if rows is not None else torch.Size((pairs.shape[0] * NB, pairs.shape[1] * 2))

    def __getitem__(self, token_ids: torch.Tensor) -> torch.Tensor:
        ids = torch.as_tensor(token_ids)
        if self.rows is not None:
            return self.rows[ids].float()
        if ids.shape == (1,):  # one client's decode step: plain indexing (a view), not a gather
            t = int(ids[0])
            return self.pairs[t // NB, :, t % NB, :].reshape(1, -1).float()
        flat = ids.reshape(-1)
        rows = self.pairs[flat // NB, :, flat % NB, :]  # [T, D / 2, 2]: row j's pairs, in order
        return rows.reshape(*ids.shape, -1).float()
