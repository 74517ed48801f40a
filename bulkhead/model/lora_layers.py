"""Adapter rows inside the C decode layers: each adapter's deltas packed
once (int8 or bf16) for csrc/lora_delta.c's lora_layer_delta, and a step's rows
grouped by adapter for it (bulkhead.model.decode_layers passes both to
csrc/decode_layers.c, which calls the delta after each base matmul).

Why: a decode step with an adapter row used to leave the C decode layers
for torch glue and add each delta from Python, about twice the base
model's step (docs/adapters.md, "Cost"). In the C layers a step with
adapter rows is the base step plus the deltas' own arithmetic.

Why int8, or bf16: the delta reads every weight of each adapter in the
step once a step, beside about 100 MB of base weights: for rank 16 on
SmolLM2-135M's seven linears 4.9 MB in int8 with one fp32 scale per rank,
9.8 MB in bf16, 19.5 MB in fp32; at one decode row the step pays for those
bytes, not for the arithmetic. In int8 each weight is within half a step
of its rank's scale (max |w| / 127) of the exact one; in bf16 a PEFT file
stored in bf16 (the common case) packs exactly, and one stored in fp32 is
rounded once, to nearest even, a relative 2^-9 of each weight
(docs/adapters.md gives the logit bounds measured). Where the C decode
layers run adapter rows, prompt passes take the same function over the same packed weights
(bulkhead.model.llama), so a request's prompt and decode steps read one
copy; the exact path (`--linear-kernel aten`) and a process where this
library does not build keep the fp32 weights of
bulkhead.model.lora_weights (bulkhead.model.lora_rows). Where the C layers
run adapter rows the adapter store packs each adapter as it loads it and
lets the fp32 tensors go (pack_only): one copy held, not two.

Products (bulkhead.lora.products, one per process): where the CPU has
AVX-512 VNNI, int8 weights times each row's x and u in int16 (vpdpwssd,
sums exact in int32); else where it has AVX-512 BF16, bf16 products
(vdpbf16ps: each row's x and u = A x rounded to bf16, sums in fp32); A and
B packed in pairs for either; else, or as BULKHEAD_LORA_PRODUCTS says,
fp32 products over bf16 weights (csrc/lora_delta.c and lora_delta_int8.h
say what each rounds; docs/adapters.md the bounds measured).

Batch invariance: the C function sums each row alone in a fixed order
(its file says how); grouping rows by adapter only shares weight reads.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading

import torch

from bulkhead.kv import huge_pages
from bulkhead.lora import products as lora_products
from bulkhead.model import lora_kernel
from bulkhead.model.decode_kernel import KernelError
from bulkhead.model.lora_weights import FusedDelta, LoraWeights

LINEARS = ("qkv", "o", "gate_up", "down")  # csrc/decode_layers.c's `which`, in its order (and a step's)
MAX_PARTS = 3  # the C file's MAX_PARTS: q, k and v
UP_BLOCK = 64  # the C file's UP_BLOCK: the columns of a block of an int8 B (block-major, _blocks)


class _Part(ctypes.Structure):
    _fields_ = [("bt", ctypes.c_void_p), ("r0", ctypes.c_int64), ("r_len", ctypes.c_int64),
                ("c0", ctypes.c_int64), ("out", ctypes.c_int64)]


class _Delta(ctypes.Structure):
    _fields_ = [("a", ctypes.c_void_p), ("rank", ctypes.c_int64), ("in_f", ctypes.c_int64),
                ("n_parts", ctypes.c_int64), ("parts", _Part * MAX_PARTS), ("scale", ctypes.c_void_p)]


class _Step(ctypes.Structure):
    _fields_ = [("n_groups", ctypes.c_int64), ("deltas", ctypes.c_void_p), ("group_start", ctypes.c_void_p),
                ("rows", ctypes.c_void_p), ("u", ctypes.c_void_p), ("u_stride", ctypes.c_int64),
                ("xb", ctypes.c_void_p), ("xb_stride", ctypes.c_int64), ("ub", ctypes.c_void_p),
                ("ub_stride", ctypes.c_int64), ("products", ctypes.c_int64), ("scales", ctypes.c_void_p)]


SCALES = 1 + MAX_PARTS  # a row's scales in the int8 scratch: its x's, then each module part's u's


class PackedAdapter:
    """One adapter's deltas as the C function reads them, for `products`
    (bulkhead.lora.products): per layer and fused linear, A [R, in] and each
    module's B transposed [r, out_m], bf16 (fp32 products); in pairs (bf16
    products), A as [ceil(in / 2), R, 2] and each B transposed as
    [ceil(r / 2), out_m, 2]: the pairs vdpbf16ps multiplies, zero-padded;
    int8: those pairs in int8, each B's block-major (_blocks), and per rank
    k of A the fp32 scale sa[k] * sb[k], A's row k in steps of sa[k] =
    max |A[k]| / 127 and its module's B's column k in steps of
    sb[k] = max |B[:, k]| / 127; all of them in one buffer, `stream`, in the
    order a step reads them (layer by layer, LINEARS' order, A then each
    module's B), so that the C delta's prefetch runs from one matrix and one
    call into the next (csrc/lora_delta_int8.h)."""

    def __init__(self, weights: LoraWeights, products: str = "fp32"):
        if products not in lora_products.PRODUCTS:
            raise ValueError(f"products must be one of {lora_products.PRODUCTS}, not {products!r}")
        n = len(weights.layers)
        self.products, self.pairs = products, products != "fp32"
        self.deltas = (_Delta * (n * len(LINEARS)))()  # zeroed: a NULL `a` is no delta
        self._keep = []  # the tensors the struct points into
        self._stream: list[torch.Tensor] = []  # int8: each matrix, flat, in the order a step reads them
        self.max_rank = self.max_in = 0
        for layer, fused in enumerate(weights.layers):
            for which, name in enumerate(LINEARS):
                if (delta := fused.get(name)) is not None:
                    self.deltas[layer * len(LINEARS) + which] = self._pack(delta)
        self.stream = self._point_into_stream() if self._stream else None
        self.nbytes = sum(t.nbytes for t in self._keep)

    def _pack(self, delta) -> _Delta:
        rank, in_f = delta.a.shape
        self.max_rank, self.max_in = max(self.max_rank, rank), max(self.max_in, in_f)
        if self.products == "int8":
            return self._pack_int8(delta)
        a = self._hold(_pairs(delta.a.t()) if self.pairs else delta.a, torch.bfloat16)
        parts = [_Part(self._hold(_pairs(p.b.t()) if self.pairs else p.b.t(), torch.bfloat16).data_ptr(),
                       *_span(p)) for p in delta.parts]
        return _Delta(a.data_ptr(), rank, in_f, len(parts), (_Part * MAX_PARTS)(*parts), None)

    def _pack_int8(self, delta) -> _Delta:
        """The delta's struct, its A and B pointers left NULL: _point_into_stream sets them once every
        matrix is in the stream."""
        qa, scale = _int8_rows(delta.a)  # [R, in], [R]
        self._stream.append(_pairs(qa.t()).to(torch.int8).flatten())
        parts = []
        for p in delta.parts:
            qbt, sb = _int8_rows(p.b.t())  # B transposed [r, out_m], one scale per rank
            scale[p.ranks[0]:p.ranks[1]] *= sb
            self._stream.append(_blocks(_pairs(qbt).to(torch.int8)))
            parts.append(_Part(None, *_span(p)))
        return _Delta(None, *qa.shape, len(parts), (_Part * MAX_PARTS)(*parts),
                      self._hold(scale, torch.float32).data_ptr())

    def _point_into_stream(self) -> torch.Tensor:
        """The int8 matrices in one buffer, each delta's A and B pointed into it (deltas in index order:
        the order they were packed in, and a step's)."""
        stream = _on_huge_pages(sum(t.numel() for t in self._stream))
        torch.cat(self._stream, out=stream)
        self._keep.append(stream)
        at, pieces = stream.data_ptr(), iter(self._stream)
        for d in self.deltas:
            if d.rank == 0:  # no delta on this linear
                continue
            d.a, at = at, at + next(pieces).numel()
            for q in range(d.n_parts):
                d.parts[q].bt, at = at, at + next(pieces).numel()
        self._stream = []
        return stream

    def _hold(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        t = t.to(dtype).contiguous()
        self._keep.append(t)
        return t


def _on_huge_pages(nbytes: int) -> torch.Tensor:
    """nbytes of int8 (uninitialised) from a huge-page boundary, its whole huge pages advised for
    transparent huge pages, as the base model's weights are (bulkhead.kv.huge_pages): the hardware
    prefetcher stops at every 4 KiB page, and a step streams the adapter as it streams them (0.46-0.57
    against 0.59-0.70 ms a token). The tail past the last whole huge page is not advised, so a worker
    holds nbytes, not a huge page more."""
    return huge_pages.arena(nbytes, whole_pages_only=True).view(torch.int8)


def _span(part) -> tuple[int, int, int, int]:
    """A ModuleB's (r0, r_len, c0, out), as _Part holds them."""
    return part.ranks[0], part.ranks[1] - part.ranks[0], part.cols[0], part.cols[1] - part.cols[0]


def _int8_rows(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """t [n, m] fp32 as int8 steps of one scale per row, max |t[i]| / 127:
    (q [n, m] int8, rounded to nearest even; scale [n] fp32, 0 for a row of 0)."""
    scale = t.abs().amax(1) / 127
    q = torch.where(scale[:, None] > 0, t / scale.clamp_min(torch.finfo(torch.float32).tiny)[:, None], 0)
    return q.round().clamp(-127, 127).to(torch.int8), scale.float()


def _blocks(t: torch.Tensor) -> torch.Tensor:
    """t [P, out, 2] (an int8 B's pairs) block-major and flat: columns [j0, j0 + UP_BLOCK) of every pair row,
    then the next block's (the last block as wide as what is left), as lora_delta_int8.h's up_rows_i8 reads
    them."""
    return torch.cat([t[:, j0:j0 + UP_BLOCK].flatten() for j0 in range(0, t.shape[1], UP_BLOCK)])


def _pairs(t: torch.Tensor) -> torch.Tensor:
    """t [n, m] as [ceil(n / 2), m, 2]: rows 2i and 2i + 1 side by side per column (an odd n's last row
    paired with 0)."""
    if t.shape[0] % 2:
        t = torch.cat([t, t.new_zeros(1, t.shape[1])])
    return t.reshape(-1, 2, t.shape[1]).transpose(1, 2)


_pack_lock = threading.Lock()  # two threads packing one adapter would build it twice, harmlessly but wastefully


def packed(weights: LoraWeights) -> PackedAdapter:
    """The adapter's packed form, made on first use and kept with its weights
    (dropped with them when the adapter store drops the adapter), for this
    process's products()."""
    with _pack_lock:
        if not weights.packed:
            weights.packed.append(PackedAdapter(weights, products()))
        return weights.packed[0]


def pack_only(weights: LoraWeights) -> LoraWeights:
    """The adapter packed for the C delta, its fp32 tensors let go: where the
    C decode layers run adapter rows, prompt passes and decode steps alike
    read only the packed copy (bulkhead.model.llama), so a worker holds one
    copy, not two (bulkhead.engine.adapter_store applies this at load)."""
    adapter = PackedAdapter(weights, products())
    layers = tuple({name: FusedDelta(d.a.to("meta"), tuple(dataclasses.replace(p, b=p.b.to("meta")) for p in d.parts))
                    for name, d in fused.items()} for fused in weights.layers)
    return LoraWeights(weights.digest, layers, 0, fp32=False, packed=[adapter])


def products() -> str:
    """How this process's delta multiplies (bulkhead.lora.products.preferred),
    where the library built here has it, else fp32 (tests and
    bench/lora_delta.py compare the three)."""
    lib, asked = load(), lora_products.preferred()
    built = {"int8": lib is not None and lib.lora_int8(), "bf16": lib is not None and lib.lora_bf16_dots()}
    return asked if built.get(asked, True) else "fp32"


def load() -> ctypes.CDLL | None:
    """lora_delta.c's library with lora_layer_delta's signature, or None
    where it does not build (adapter rows then take the torch glue)."""
    lib = lora_kernel.load()
    if lib is not None and lib.lora_layer_delta.restype is not ctypes.c_int64:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.lora_layer_delta.restype = i64
        lib.lora_layer_delta.argtypes = [p, i64, i64, p, i64, i64, p, i64, ctypes.c_int]
        lib.lora_bf16_dots.restype = ctypes.c_int
        lib.lora_int8.restype = ctypes.c_int
    return lib


_last_step = threading.local()  # .deltas: this thread's last single-adapter StepDeltas (step_deltas)


def step_deltas(lib: ctypes.CDLL, lora) -> StepDeltas:
    """A decode step's StepDeltas for its rows (lora: a LoraRows): the last
    one this thread built, where the step holds the same rows under the
    same adapter (one group; bulkhead.model.lora_rows.row_index hands equal
    row lists one tensor), its scratch's 16-bit u zeroed again as a fresh
    one's is; else a new one, kept for the next step where it has one group.

    Why: a client decoding on one adapter has the same grouping step after
    step, and building the C call's tables and scratch again each step (a
    dozen small tensors, after the step has streamed the caches through) was
    ~0.1 ms of the ~0.7 ms a token the adapter cost the served decode worker
    (docs/adapters.md). The kept one holds its adapter's weights alive until
    this thread's next adapter step replaces it: by then the adapter is the
    most recently used, well inside the adapter store's idle ones."""
    last = getattr(_last_step, "deltas", None)
    if last is not None and last.reusable_for(lib, lora):
        last.restart()
        return last
    deltas = StepDeltas(lib, lora)
    _last_step.deltas = deltas if len(lora.groups) == 1 else None
    return deltas


def _even_above(n: int) -> int:
    return n + 2 - n % 2


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
        kind = adapters[0].products
        if any(a.products != kind for a in adapters):
            raise KernelError(f"adapters packed for {sorted({a.products for a in adapters})} products in one step")
        # 16-bit scratch (bf16 or int16), rows of even strides above the widest input and rank: each row's
        # x, and its u. An odd rank's last pair reads one number past its ranks, against a 0 weight: the
        # next module's u, or past the last one this zeroed scratch (never a NaN pattern: NaN * 0 = NaN).
        xb_stride, ub_stride = (0, 0)
        if adapters[0].pairs:
            xb_stride, ub_stride = _even_above(max(a.max_in for a in adapters)), _even_above(u_stride)
        self._xb = torch.empty(starts[-1] * xb_stride, dtype=torch.int16)
        self._ub = torch.zeros(starts[-1] * ub_stride, dtype=torch.int16)
        self._scales = torch.empty(starts[-1] * SCALES if kind == "int8" else 0)  # each row's x and u scales
        index = self._index.data_ptr()
        self.step = _Step(len(adapters), ctypes.addressof(self._tables), index, index + 8 * len(starts),
                          self._u.data_ptr(), u_stride, self._xb.data_ptr(), xb_stride, self._ub.data_ptr(),
                          ub_stride, lora_products.PRODUCTS.index(kind),
                          self._scales.data_ptr() if kind == "int8" else None)
        self.fn = ctypes.cast(lib.lora_layer_delta, ctypes.c_void_p).value

    def reusable_for(self, lib: ctypes.CDLL, lora) -> bool:
        """Whether this step's tables serve `lora` (a LoraRows) as they are:
        one group, the same weights and the same row tensor (step_deltas)."""
        if lib is not self._lib or len(lora.groups) != 1 or len(self._lora.groups) != 1:
            return False
        (weights, rows), (mine, my_rows) = lora.groups[0], self._lora.groups[0]
        return weights is mine and rows is my_rows

    def restart(self) -> None:
        """The scratch as a new StepDeltas holds it, where that matters: an
        odd rank's last pair reads the 16-bit u past its ranks against a 0
        weight, and in bf16 only zeros there (never a NaN pattern a row of an
        earlier step left) keep a row's numbers those of a step alone; an
        int16 times 0 is 0 whatever it holds."""
        if self.step.products == lora_products.PRODUCTS.index("bf16"):
            self._ub.zero_()

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
