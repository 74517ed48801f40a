"""Adapter rows inside the C decode layers: each adapter's deltas packed
once in bf16 for csrc/lora_delta.c's lora_layer_delta, and a step's rows
grouped by adapter for it (bulkhead.model.decode_layers passes both to
csrc/decode_layers.c, which calls the delta after each base matmul).

Why: a decode step with an adapter row used to leave the C decode layers
for torch glue and add each delta from Python, about twice the base
model's step (docs/adapters.md, "Cost"). In the C layers a step with
adapter rows is the base step plus the deltas' own arithmetic.

Why bf16: the delta reads every weight of each adapter in the step once a
step, 9.8 MB in bf16 for rank 16 on SmolLM2-135M's seven linears (19.5 MB
in fp32), beside about 100 MB of base weights. A PEFT file stored in bf16
(the common case) packs exactly; one stored in fp32 is rounded once, to
nearest even, a relative 2^-9 of each weight of the delta (docs/adapters.md
gives the logit bound measured). Where the C decode layers run adapter
rows, prompt passes take the same function over the same packed weights
(bulkhead.model.llama), so a request's prompt and decode steps read one
copy; the exact path (`--linear-kernel aten`) and a process where this
library does not build keep the fp32 weights of
bulkhead.model.lora_weights (bulkhead.model.lora_rows), and the packed copy
is made the first time an adapter runs in C.

Batch invariance: the C function sums each row alone in a fixed order
(its file says how); grouping rows by adapter only shares weight reads.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from bulkhead.model import lora_kernel
from bulkhead.model.decode_kernel import KernelError
from bulkhead.model.lora_weights import LoraWeights

LINEARS = ("qkv", "o", "gate_up", "down")  # csrc/decode_layers.c's `which`, in its order
MAX_PARTS = 3  # the C file's MAX_PARTS: q, k and v


class _Part(ctypes.Structure):
    _fields_ = [("bt", ctypes.c_void_p), ("r0", ctypes.c_int64), ("r_len", ctypes.c_int64),
                ("c0", ctypes.c_int64), ("out", ctypes.c_int64)]


class _Delta(ctypes.Structure):
    _fields_ = [("a", ctypes.c_void_p), ("rank", ctypes.c_int64), ("in_f", ctypes.c_int64),
                ("n_parts", ctypes.c_int64), ("parts", _Part * MAX_PARTS)]


class _Step(ctypes.Structure):
    _fields_ = [("n_groups", ctypes.c_int64), ("deltas", ctypes.c_void_p), ("group_start", ctypes.c_void_p),
                ("rows", ctypes.c_void_p), ("u", ctypes.c_void_p), ("u_stride", ctypes.c_int64)]


class PackedAdapter:
    """One adapter's deltas as the C function reads them: per layer and fused
    linear, A [R, in] and each module's B transposed [r, out_m], bf16."""

    def __init__(self, weights: LoraWeights):
        n = len(weights.layers)
        self.deltas = (_Delta * (n * len(LINEARS)))()  # zeroed: a NULL `a` is no delta
        self._keep = []  # the bf16 tensors the struct points into
        self.max_rank = 0
        for layer, fused in enumerate(weights.layers):
            for which, name in enumerate(LINEARS):
                if (delta := fused.get(name)) is not None:
                    self.deltas[layer * len(LINEARS) + which] = self._pack(delta)
        self.nbytes = sum(t.nbytes for t in self._keep)

    def _pack(self, delta) -> _Delta:
        a = self._hold(delta.a)
        parts = [_Part(self._hold(p.b.t()).data_ptr(), p.ranks[0], p.ranks[1] - p.ranks[0], p.cols[0],
                       p.cols[1] - p.cols[0]) for p in delta.parts]
        self.max_rank = max(self.max_rank, a.shape[0])
        return _Delta(a.data_ptr(), a.shape[0], a.shape[1], len(parts), (_Part * MAX_PARTS)(*parts))

    def _hold(self, t: torch.Tensor) -> torch.Tensor:
        t = t.to(torch.bfloat16).contiguous()
        self._keep.append(t)
        return t


_pack_lock = threading.Lock()  # two threads packing one adapter would build it twice, harmlessly but wastefully


def packed(weights: LoraWeights) -> PackedAdapter:
    """The adapter's packed form, made on first use and kept with its weights
    (dropped with them when the adapter store drops the adapter)."""
    with _pack_lock:
        if not weights.packed:
            weights.packed.append(PackedAdapter(weights))
        return weights.packed[0]


def load() -> ctypes.CDLL | None:
    """lora_delta.c's library with lora_layer_delta's signature, or None
    where it does not build (adapter rows then take the torch glue)."""
    lib = lora_kernel.load()
    if lib is not None and lib.lora_layer_delta.restype is not ctypes.c_int64:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.lora_layer_delta.restype = i64
        lib.lora_layer_delta.argtypes = [p, i64, i64, p, i64, i64, p, i64, ctypes.c_int]
    return lib


class StepDeltas:
    """A pass's adapter rows for lora_layer_delta. A decode step hands `fn`
    and `step` to decode_layers.c (its last two arguments); a prompt pass's
    torch glue calls `add` after each matmul, as it would LoraRows.add.
    Holds what the struct points into."""

    def __init__(self, lib: ctypes.CDLL, lora) -> None:
        """lora: the pass's bulkhead.model.lora_rows.LoraRows."""
        self._lib, self._lora = lib, lora
        adapters = [packed(weights) for weights, _ in lora.groups]
        starts = [0]
        for _, rows in lora.groups:
            starts.append(starts[-1] + len(rows))
        # One int64 tensor (a step pays per tensor): each group's start in the rows, then the rows grouped by adapter.
        self._index = torch.cat([torch.tensor(starts), *(rows for _, rows in lora.groups)])
        self._tables = (ctypes.c_void_p * len(adapters))(*(ctypes.addressof(a.deltas) for a in adapters))
        self._adapters = adapters  # alive while the struct points into them
        u_stride = max(a.max_rank for a in adapters)
        self._u = torch.empty(starts[-1] * max(u_stride, 1))  # scratch: each row's A x, [rows, u_stride]
        index = self._index.data_ptr()
        self.step = _Step(len(adapters), ctypes.addressof(self._tables), index, index + 8 * len(starts),
                          self._u.data_ptr(), u_stride)
        self.fn = ctypes.cast(lib.lora_layer_delta, ctypes.c_void_p).value

    def add(self, layer: int, linear: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y [T, out] (the base output of `linear` for x [T, in], fp32 with
        unit column stride) plus each adapter row's delta, in place."""
        x = x.contiguous()
        if x.dtype != torch.float32 or y.dtype != torch.float32 or y.stride(-1) != 1:
            raise KernelError(f"the C LoRA delta takes float32 rows, not {x.dtype} into {y.dtype}")
        rc = self._lib.lora_layer_delta(ctypes.addressof(self.step), layer, LINEARS.index(linear), x.data_ptr(),
                                        x.stride(0), x.shape[1], y.data_ptr(), y.stride(0), torch.get_num_threads())
        if rc:
            raise KernelError(f"the C LoRA delta refused layer {layer}'s {linear}: an adapter's input width or "
                              f"rank does not fit it")
        return y

    def touches(self, layer: int, linear: str) -> bool:
        return self._lora.touches(layer, linear)
