"""The tensors of one forward pass over the paged KV cache.

Built only by the model runner (bulkhead.engine.runner); the model reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SequenceSlice:
    """One sequence's part of a forward pass.

    Query rows [row_start, row_end) of the batch belong to this sequence; its
    KV lives in `num_pages` pages starting at `page_offset` in the batch's
    gathered page list and covers positions [0, kv_len) once this pass has
    written its own rows. kv_len is the written watermark: attention never
    reads a position at or past it.
    """

    row_start: int
    row_end: int
    kv_len: int
    page_offset: int
    num_pages: int

    @property
    def num_queries(self) -> int:
        return self.row_end - self.row_start

    @property
    def fresh(self) -> bool:
        # The pass holds every position of the sequence: attention can use the
        # rows just computed instead of reading them back from the pool.
        return self.num_queries == self.kv_len


@dataclass(frozen=True)
class PagedBatch:
    token_ids: torch.Tensor  # [T] int64; rows past the real tokens are padding
    positions: torch.Tensor  # [T] int64
    write_slots: torch.Tensor  # [N] int64 flat pool slot (page * page_size + offset) of each real row
    pages: torch.Tensor  # [P] int64 every sequence's pages, concatenated
    sequences: tuple[SequenceSlice, ...]
    logit_rows: torch.Tensor  # [S] int64 rows whose next-token logits are wanted (decode: every row, in order)
    # Decode rows go through the linear layers in fixed tiles of this many
    # rows, so a request's numbers do not depend on how many others share
    # its batch (the isolation oracle needs batch-invariant greedy output).
    # 0 = one matmul over all rows.
    row_tile: int = 0
    # Every row is a decode row (one per request): the linear layers take
    # their decode kernel (bulkhead.model.linear_kernel.Linear).
    decode: bool = False
    # Decode steps, for the C attention kernel: per sequence, where its pages
    # start in `pages`, and its kv_len. [S] int64 each; None otherwise.
    decode_page_offset: torch.Tensor | None = None
    decode_kv_len: torch.Tensor | None = None
    # The rows run under a tenant's LoRA adapter, grouped by adapter
    # (bulkhead.model.lora_rows.LoraRows); None when every row is the base model's.
    lora: object | None = None

