"""The token embedding read from the lm_head's 8-bit packing, where the two
are tied (one tensor, as in SmolLM2) and the lm_head runs `q8-i16in`.

Why: the fp32 embedding (49152 x 576, 113 MB) was kept beside the lm_head's
8-bit copy (32 MB) only for token lookup, in every worker. The 8-bit copy
holds the same numbers: `q8-i16in` is chosen only where every group of 32
weights is q * d with q * d == w bit for bit in fp32 (i16in_kernel.q8_grid),
so a row rebuilt as q * d is the fp32 row, bit for bit
(tests/model/test_q8_embedding.py checks every row of SmolLM2's).
"""

from __future__ import annotations

import torch

from bulkhead.model import q4_kernel

NB = q4_kernel.BLOCK  # outputs (here: vocabulary rows) per packed block
G = q4_kernel.GROUP  # inputs per scale


class Q8Embedding:
    """`embedding[token_ids]` -> fp32 rows [T, D], from head_linear.pack_q8_0's (qb, d)."""

    dtype = torch.float32

    def __init__(self, packed: tuple[torch.Tensor, torch.Tensor]):
        self.qb, self.d = packed  # qb int8 [V/NB, D/2, 2, NB/2, 2]; d fp16 [V/NB, D/G, NB]
        self.shape = torch.Size((self.qb.shape[0] * NB, self.qb.shape[1] * 2))

    def __getitem__(self, token_ids: torch.Tensor) -> torch.Tensor:
        if isinstance(token_ids, torch.Tensor) and token_ids.shape == (1,):
            return self._one(int(token_ids[0]))
        ids = torch.as_tensor(token_ids).reshape(-1)
        block, j = ids // NB, ids % NB
        q = self.qb[block, :, j // (NB // 2), j % (NB // 2), :]  # [T, D/2, 2]
        d = self.d[block, :, j].float()  # [T, D/G], widened exactly
        rows = (q.float().reshape(ids.shape[0], -1, G) * d.unsqueeze(-1)).reshape(ids.shape[0], -1)
        return rows.reshape(*torch.as_tensor(token_ids).shape, -1)

    def _one(self, token_id: int) -> torch.Tensor:
        """One token's row [1, D]: the same product as __getitem__'s, read
        through plain indexing (views) instead of gathers. One client's
        decode step embeds one token: 37 against 95 us, measured."""
        block, j = divmod(token_id, NB)
        q = self.qb[block, :, j // (NB // 2), j % (NB // 2), :]  # [D/2, 2]
        d = self.d[block, :, j].float()  # [D/G]
        return (q.float().reshape(1, -1, G) * d.unsqueeze(-1)).reshape(1, -1)
