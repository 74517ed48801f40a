"""A stand-in for the transformer that makes every KV read checkable.

Each simulated request's prompt is one repeated token, its *canary*, unique
to the request. For every token computed the model writes K = the token and
V = its position where the real model writes K/V; it then reads back every
position [0, kv_len) of each sequence, as attention would, and expects K =
the sequence's own canary and V = the position. Anything else (another
request's canary, a scrubbed 0, a moved position) is a read of KV not
written for this request. It predicts the canary again, so greedy decoding
keeps writing the request's own. Why not a tiny Llama: docs/simulation.md.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from bulkhead.model.batch import PagedBatch

# (worker, canary of the reading sequence, position, K seen, V seen)
BadRead = tuple[str, int, int, float, float]


class CanaryModel:
    config = None  # no base model's config: it serves no LoRA adapter (bulkhead.engine.adapter_store)

    def __init__(self, vocab_size: int, worker: str, on_bad_read: Callable[[BadRead], None]):
        self.vocab_size = vocab_size
        self.worker = worker
        self.on_bad_read = on_bad_read

    def forward(self, batch: PagedBatch, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        self.start_pass(batch)
        self.run_layers(batch, layers, None, 0, len(layers))
        return self.finish_pass(batch, layers)

    # A pass in slices (bulkhead.engine.pass_slices): the first slice writes
    # every layer's KV, the last reads it back; other steps run in between,
    # so the pass's own KV must still be there when it reads.
    def start_pass(self, batch: PagedBatch) -> None:
        return None

    def run_layers(self, batch: PagedBatch, layers: list[tuple[torch.Tensor, torch.Tensor]], state, start: int,
                   stop: int):
        if start == 0:
            self._write(batch, layers)
        return layers if stop == len(layers) else None

    def finish_pass(self, batch: PagedBatch, state) -> torch.Tensor:
        """state: the pool's layer views (run_layers returns them when the pass's last layer ran)."""
        views, page_size = self._views(state)
        tokens = batch.token_ids.numpy()
        pages = batch.pages.numpy()
        for seq in batch.sequences:
            self._check_read(int(tokens[seq.row_end - 1]), pages[seq.page_offset : seq.page_offset + seq.num_pages],
                             seq.kv_len, views, page_size)
        rows = batch.logit_rows
        logits = torch.zeros(len(rows), self.vocab_size)
        logits[torch.arange(len(rows)), batch.token_ids[rows]] = 1.0  # the canary predicts itself
        return logits

    @staticmethod
    def _views(layers):
        # Position-major numpy views of the same storage, [pages, page_size, kv_heads, head_dim]
        # (K is stored head-dim-major inside a page: bulkhead.kv.pool.KVPool).
        return [(k.numpy().transpose(0, 3, 1, 2), v.numpy()) for k, v in layers], layers[0][1].shape[1]

    def _write(self, batch: PagedBatch, layers) -> None:
        # numpy views of the same storage: these pools are tiny and per-op overhead dominates
        slots = batch.write_slots.numpy()  # real rows only; padding rows write nothing
        n = len(slots)
        tokens = batch.token_ids.numpy()
        positions = batch.positions.numpy()[:n]
        views, page_size = self._views(layers)
        for k, v in views:
            k[slots // page_size, slots % page_size] = tokens[:n, None, None]
            v[slots // page_size, slots % page_size] = positions[:, None, None]

    def _check_read(self, canary: int, pages: np.ndarray, kv_len: int, views, page_size: int) -> None:
        pos = np.arange(kv_len)
        page, offset = pages[pos // page_size], pos % page_size  # [kv_len] each
        for k, v in views:
            seen_k = k[page, offset].reshape(kv_len, -1)  # [kv_len, heads * dim]
            seen_v = v[page, offset].reshape(kv_len, -1)
            bad = ((seen_k != canary) | (seen_v != pos[:, None])).any(axis=1)
            if bad.any():
                i = int(bad.nonzero()[0][0])
                self.on_bad_read((self.worker, canary, i, float(seen_k[i, 0]), float(seen_v[i, 0])))
                return  # one report per sequence and step is enough
