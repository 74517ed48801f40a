"""A pass's rows grouped by adapter, and each group's low-rank delta added to a linear's output.

The base matmul runs once for every row of the pass; then each adapter's
rows (gathered by index, as Punica's and S-LoRA's segmented kernels group
them) get that adapter's delta, and rows under the base model get none.

Batch invariance: a request's numbers must not depend on who shares its
pass (the isolation oracle). A CPU GEMM's kernel, and so its order of
summation, changes with the row count, so a group's rows go through the
deltas in tiles of exactly TILE rows (the last one zero-padded), as one
batched matmul of [tiles, TILE, in] whose every tile has the same shape: a
row gets the same numbers whether its group holds one row or many.
tests/model/test_lora_model.py checks it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bulkhead.model import lora_kernel
from bulkhead.model.decode_kernel import KernelError
from bulkhead.model.lora_weights import LoraWeights

TILE = 16
# Row lists up to this long get one shared index tensor each (row_index); a
# prompt pass's longer lists are built fresh (they would only fill the table).
SHARED_INDEX_ROWS = 64
_SHARED_INDEX_LIMIT = 1024  # distinct row lists kept (the table is cleared when full)
_shared_index: dict[tuple[int, ...], torch.Tensor] = {}


@dataclass(frozen=True)
class LoraRows:
    groups: tuple[tuple[LoraWeights, torch.Tensor], ...]  # (adapter, row indices [n] int64) per adapter in the pass
    whole_pass: bool = False  # one group holding every real row, 0..n-1 (a prompt chunk's pass)

    @classmethod
    def of(cls, row_adapters: list[LoraWeights | None]) -> LoraRows | None:
        """From each row's adapter (None: the base model); None when no row has one."""
        by_digest: dict[str, tuple[LoraWeights, list[int]]] = {}
        for row, adapter in enumerate(row_adapters):
            if adapter is not None:
                by_digest.setdefault(adapter.digest, (adapter, []))[1].append(row)
        if not by_digest:
            return None
        groups = tuple((w, row_index(rows)) for w, rows in by_digest.values())
        return cls(groups, len(groups) == 1 and len(groups[0][1]) == len(row_adapters))

    def add(self, layer: int, linear: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y (the base output of `linear` for inputs x, [T, out]) plus each
        row's delta; y is updated in place and returned. The C kernel where
        it builds (each row summed alone), else tiled torch matmuls: one
        process always takes the same one, so a row's numbers never depend
        on its batch."""
        if not all(weights.fp32 for weights, _ in self.groups):
            raise KernelError("an adapter held only packed for the C delta reached the fp32 delta")
        lib = lora_kernel.load()
        if lib is not None and x.dtype == y.dtype == torch.float32 and y.stride(-1) == 1:
            x = x.contiguous()
            for weights, rows in self.groups:
                if (delta := weights.layers[layer].get(linear)) is not None:
                    lora_kernel.add_delta(lib, x, y, rows, delta)
            return y
        for weights, rows in self.groups:
            delta = weights.layers[layer].get(linear)
            if delta is None:
                continue
            n = len(rows)
            # A prompt chunk's pass (every real row, rows 0..n-1): slices, no gather or scatter.
            u = _tiled((x[:n] if self.whole_pass else x.index_select(0, rows)).float(), delta.a)  # [tiles, TILE, R]
            for part in delta.parts:
                d = _tiled_mm(u[:, :, part.ranks[0]:part.ranks[1]], part.b)
                d = d.reshape(-1, d.shape[-1])[:n].to(y.dtype)
                if self.whole_pass:
                    y[:n, part.cols[0]:part.cols[1]] += d
                else:
                    y[:, part.cols[0]:part.cols[1]].index_add_(0, rows, d)
        return y

    def touches(self, layer: int, linear: str) -> bool:
        return any(linear in weights.layers[layer] for weights, _ in self.groups)


def row_index(rows: list[int]) -> torch.Tensor:
    """rows as an int64 tensor [n], read only: one shared tensor per distinct
    list of up to SHARED_INDEX_ROWS rows. Why: a decode step's grouping
    repeats step after step (one client: row 0, every step), and a step that
    hands its adapter rows the same tensor as the last lets
    bulkhead.model.lora_layers.step_deltas reuse that step's C tables and
    scratch instead of building them again (with torch.tensor here, ~0.17 ms
    of the decode worker's Python a token under an adapter, served;
    docs/adapters.md). Nothing writes into these tensors."""
    if len(rows) > SHARED_INDEX_ROWS:
        return torch.tensor(rows, dtype=torch.long)
    key = tuple(rows)
    index = _shared_index.get(key)
    if index is None:
        if len(_shared_index) >= _SHARED_INDEX_LIMIT:
            _shared_index.clear()
        index = _shared_index[key] = torch.tensor(rows, dtype=torch.long)
    return index


def _tiled(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """x [n, in] @ a.T, as [tiles, TILE, R]: rows zero-padded to whole tiles."""
    n = x.shape[0]
    tiles = -(-n // TILE)
    if tiles * TILE != n:
        x = torch.cat([x, x.new_zeros(tiles * TILE - n, x.shape[1])])
    return _tiled_mm(x.view(tiles, TILE, -1), a)


def _tiled_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [tiles, TILE, k] @ w.T [k, out]: one matmul of one shape per tile."""
    return torch.bmm(x, w.t().expand(x.shape[0], *w.t().shape))
