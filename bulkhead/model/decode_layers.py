"""A decode step's transformer layers in one C call (csrc/decode_layers.c):
the glue between the matmuls and attention in C, the matmuls through the
layers' own decode kernel (their `decode_fn`: q4, q4-i16in, gguf-i16in or
bf16), and attention through the C decode kernel (bulkhead.model.decode_kernel),
the same kernels the torch path calls.

Why: at one request the ~600 small torch ops a step makes around its
matmuls (RMSNorm, rotary, the KV write, SiLU, residuals) and the 150 ctypes
calls into the kernels cost about as much as the attention itself
(docs/performance.md). Elsewhere (`why_not`), the model runs its decode
layers through torch. Its numbers equal the torch path's up to the order of
two sums (the C file says which). Batch invariance: each row's glue reads
only that row and the kernels are invariant themselves (tested bitwise in
tests/model/test_decode_layers.py); where the engine tiles decode rows
instead, the model takes the torch path. Rows under a LoRA adapter stay
here: the C file adds their deltas after each matmul (bulkhead.model.lora_layers).

Where the lm_head's kernel has the same signature (head_linear's
`tail_kernel`: `q8-i16in`, `bf16-in`), `step` runs the step's tail in the
same call: the final RMSNorm, the lm_head, and each request row's finite
check and greedy pick (StepTail), which the runner and the sampler then
read instead of going over the logits again in Python.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from bulkhead.model import kernel_names
from bulkhead.model import decode_kernel, lora_layers, q4_kernel
from bulkhead.model.decode_kernel import KernelError

log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "decode_layers.c"
# Rotary and the adds must round as torch's separate ops do: no fused multiply-add.
FLAGS = (*decode_kernel.FLAGS, "-ffp-contract=off")
MAX_KV_ROW = 2048  # the C file's MAX_KV_ROW (load() checks): KV heads x head_dim of one row
CHOICES = kernel_names.DECODE_GLUE
KV_KIND = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
ERRORS = {-1: "a pool or model geometry it does not take (or attention refused its geometry, or ran out of memory)",
          -2: "a write slot outside the pool", -3: "a position outside the rotary tables", -4: "no memory",
          -5: "a matmul the 4-bit kernel refused (a shape it does not take, or no memory for its scratch)",
          -6: "an adapter's delta whose input width or rank does not fit the layer"}


class _Q4(ctypes.Structure):
    _fields_ = [("qs", ctypes.c_void_p), ("dm", ctypes.c_void_p)]


class _Layer(ctypes.Structure):
    _fields_ = [("input_norm", ctypes.c_void_p), ("post_norm", ctypes.c_void_p), ("qkv_bias", ctypes.c_void_p),
                ("qkv", _Q4), ("o", _Q4), ("gate_up", _Q4), ("down", _Q4),
                ("k_pool", ctypes.c_void_p), ("v_pool", ctypes.c_void_p)]


class _Head(ctypes.Structure):
    _fields_ = [("final_norm", ctypes.c_void_p), ("w", ctypes.c_void_p), ("w2", ctypes.c_void_p),
                ("linear", ctypes.c_void_p), ("vocab", ctypes.c_int64)]


class _Model(ctypes.Structure):
    _fields_ = [("layers", ctypes.c_void_p),
                *((name, ctypes.c_int64) for name in ("num_layers", "D", "H", "KVH", "hd", "I", "page_size",
                                                       "kv_kind", "num_pool_pages", "page_stride")),
                ("cos", ctypes.c_void_p), ("sin", ctypes.c_void_p), ("max_positions", ctypes.c_int64),
                ("eps", ctypes.c_float), ("scale", ctypes.c_float),
                ("linear", ctypes.c_void_p), ("attention", ctypes.c_void_p)]


@functools.cache
def load() -> ctypes.CDLL | None:
    """The glue library, or None where there is no compiler or it fails to build."""
    cc = decode_kernel._compiler()
    if cc is None:
        return None
    try:
        lib = ctypes.CDLL(str(decode_kernel._build(cc, list(FLAGS), SOURCE)))
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("could not build the C decode layers (%s): decode glue runs through torch",
                    str(getattr(e, "stderr", "") or e).strip()[:500])
        return None
    lib.max_kv_row.restype = ctypes.c_int
    assert lib.max_kv_row() == MAX_KV_ROW
    lib.decode_layers.restype = ctypes.c_int64
    lib.decode_layers.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                  *[ctypes.c_void_p] * 3, ctypes.c_int64, *[ctypes.c_void_p] * 2, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_void_p]
    lib.decode_step.restype = ctypes.c_int64
    lib.decode_step.argtypes = [ctypes.c_void_p, *lib.decode_layers.argtypes, *[ctypes.c_void_p] * 3]
    lib.pick_rows.restype = ctypes.c_int64
    lib.pick_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return lib


@dataclass
class StepTail:
    """What the C decode step computed after the lm_head, for the rows
    [0, S) of its requests (not the padding): each row's greedy pick (the
    first of equal maxima, NaN the largest: torch.argmax's rule), and
    whether every one of those rows' logits is finite."""

    picks: list[int]
    finite: bool


def pick_rows(logits: torch.Tensor) -> StepTail:
    """The C step's tail over logits [S, V] float32 alone (what decode_step
    runs after its lm_head): each row's greedy pick and whether all are finite."""
    logits = logits.contiguous()
    if logits.dtype != torch.float32 or logits.dim() != 2 or logits.shape[1] < 1:
        raise ValueError(f"logits must be float32 [S, V >= 1], not {logits.dtype} {tuple(logits.shape)}")
    out = torch.empty(logits.shape[0], dtype=torch.int64)
    nonfinite = load().pick_rows(logits.data_ptr(), logits.shape[0], logits.shape[1], out.data_ptr())
    return StepTail(out.tolist(), nonfinite == 0)


class DecodeLayers:
    """The C path for one model's weights; `run(x, batch, kv_layers)` puts
    a decode batch's embedded rows through every layer, in place."""

    def __init__(self, config, weights, cos: torch.Tensor, sin: torch.Tensor, lib: ctypes.CDLL):
        self.config, self.weights, self.lib = config, weights, lib
        self.cos, self.sin = cos.contiguous(), sin.contiguous()
        # The layers' decode kernel (their decode_fn): each has linear_q4's signature.
        self._linear = ctypes.cast(weights.layers[0].qkv.decode_fn(), ctypes.c_void_p).value
        self._pool_key = None
        self._model = None
        self._head = self._bind_head(weights)

    def _bind_head(self, weights) -> _Head | None:
        """The lm_head for `step`, or None where its kernel runs from Python
        (no tail_kernel: bf16w, fp32) or the final norm is not fp32."""
        tail = getattr(weights.lm_head, "tail_kernel", None)
        found = tail() if tail is not None else None
        norm = weights.final_norm
        if found is None or norm.dtype != torch.float32 or not norm.is_contiguous():
            return None
        fn, w, w2 = found
        self._head_keep = (norm, w, w2)  # the struct holds their addresses
        return _Head(norm.data_ptr(), w.data_ptr(), w2.data_ptr(), ctypes.cast(fn, ctypes.c_void_p).value,
                     weights.lm_head.out_features)

    @property
    def runs_head(self) -> bool:
        """Whether `step` runs the lm_head and the tail in the same call."""
        return self._head is not None

    @staticmethod
    def why_not(config, weights, decode_attention: str) -> str | None:
        """Why the C layers cannot run this model, or None when they can:
        every layer's linear weights run the 4-bit kernel, decode attention
        is the C kernel, and the glue builds here."""
        from bulkhead.model.format_linear import CodedLinear  # they import this module's neighbours
        from bulkhead.model.linear_kernel import BF16Linear, Q4Linear

        if decode_attention != "c":
            return f"decode attention is {decode_attention}, not c"
        if config.num_kv_heads * config.head_dim > MAX_KV_ROW:
            return f"{config.num_kv_heads} KV heads x head_dim {config.head_dim} is over {MAX_KV_ROW}"
        if weights.embed.dtype != torch.float32:
            return f"the model is {weights.embed.dtype}, not float32"
        linears = [lin for layer in weights.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        if not any(all(isinstance(lin, kind) for lin in linears) for kind in (Q4Linear, BF16Linear, CodedLinear)):
            return "the linear layers do not run the q4 kernel, nor all the bf16 one, nor all gguf-i16in"
        if isinstance(linears[0], Q4Linear) and q4_kernel.load() is None:
            return "the q4 kernel cannot be built here"
        if len({lin.decode_inputs for lin in linears}) > 1:  # the C layers call one kernel for every matmul
            return "the linear layers mix decode kernels (fp32, bf16 or 16-bit integer inputs)"
        if linears[0].decode_fn() is None:
            return f"the {linears[0].decode_inputs}-input 4-bit decode kernel cannot be loaded here"
        if load() is None:
            return "the C file could not be built here (see the log)"
        return None

    def _bind(self, kv_layers: list[tuple[torch.Tensor, torch.Tensor]]) -> _Model:
        """The C Model struct for this pool, built once per pool."""
        k0, v0 = kv_layers[0]
        # The list itself is kept (below), so its id names it while it lives.
        key = (id(kv_layers), len(kv_layers), k0.data_ptr(), k0.shape, k0.stride(0), k0.dtype)
        if key == self._pool_key:
            return self._model
        cfg = self.config
        kind = KV_KIND.get(k0.dtype)
        views = [t for pair in kv_layers for t in pair]
        page_size = v0.shape[1]
        k_shape, v_shape = (cfg.num_kv_heads, cfg.head_dim, page_size), (page_size, cfg.num_kv_heads, cfg.head_dim)
        if len(kv_layers) != len(self.weights.layers):
            raise KernelError(f"{len(kv_layers)} pool layers for a model of {len(self.weights.layers)}")
        if kind is None or not decode_kernel._pages_contiguous(*views) or any(t.dtype != k0.dtype for t in views) \
                or any(tuple(k.shape[1:]) != k_shape or tuple(v.shape[1:]) != v_shape for k, v in kv_layers):
            raise KernelError(f"the C decode layers read pool views of one dtype, K pages {list(k_shape)} and V "
                              f"pages {list(v_shape)}, each contiguous and one stride apart")
        attention = decode_kernel.load(cfg.head_dim, cfg.num_heads // cfg.num_kv_heads, page_size,
                                       decode_kernel._kv_name(k0.dtype))
        if attention is None:
            raise KernelError(f"the C decode-attention kernel is not available for a {k0.dtype} pool")
        keep = []  # contiguous fp32 copies where a weight is not one already, alive as long as the struct

        def ptr(t):
            if t is None:
                return None
            if t.dtype != torch.float32 or not t.is_contiguous():
                t = t.float().contiguous()
                keep.append(t)
            return t.data_ptr()

        layers = (_Layer * len(self.weights.layers))()
        for i, (w, (k, v)) in enumerate(zip(self.weights.layers, kv_layers)):
            layers[i] = _Layer(ptr(w.input_norm), ptr(w.post_norm), ptr(w.qkv_bias),
                               *(_Q4(lin.packed[0].data_ptr(), lin.packed[1].data_ptr())
                                 for lin in (w.qkv, w.o, w.gate_up, w.down)),
                               k.data_ptr(), v.data_ptr())
        self._layers, self._keep, self._kv_layers = layers, keep, kv_layers
        self._model = _Model(ctypes.addressof(layers), len(layers), cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
                             cfg.head_dim, cfg.intermediate_size, page_size, kind, k0.shape[0], k0.stride(0),
                             self.cos.data_ptr(), self.sin.data_ptr(), self.cos.shape[0], cfg.rms_norm_eps,
                             cfg.head_dim ** -0.5, self._linear,
                             ctypes.cast(attention.paged_decode_attention, ctypes.c_void_p).value)
        self._pool_key = key
        return self._model

    def run(self, x: torch.Tensor, batch, kv_layers) -> torch.Tensor:
        """x [T, D] float32 (the step's embedded rows), returned after the last layer."""
        x = x.contiguous()
        self._call(self.lib.decode_layers, x, batch, kv_layers)
        return x

    def step(self, x: torch.Tensor, batch, kv_layers) -> tuple[torch.Tensor, StepTail]:
        """x [T, D] float32 through every layer, the final norm and the
        lm_head (runs_head): (logits [T, V] float32, the rows' StepTail)."""
        x, rows = x.contiguous(), batch.decode_kv_len.shape[0]
        logits = torch.empty(x.shape[0], self._head.vocab, dtype=torch.float32)
        out = torch.empty(rows + 1, dtype=torch.int64)  # the picks, then the count of non-finite rows
        self._call(self.lib.decode_step, x, batch, kv_layers, ctypes.addressof(self._head),
                   tail=(logits.data_ptr(), out.data_ptr(), out.data_ptr() + 8 * rows))
        *picks, nonfinite = out.tolist()
        return logits, StepTail(picks, nonfinite == 0)

    def _call(self, fn, x: torch.Tensor, batch, kv_layers, *head, tail=()) -> None:
        """fn (decode_layers, or decode_step with its head and tail
        pointers) over x in place; raises where the C file refuses."""
        model = self._bind(kv_layers)
        rows = batch.decode_kv_len.shape[0]
        index = (batch.positions, batch.write_slots, batch.pages, batch.decode_page_offset, batch.decode_kv_len)
        if any(t.dtype != torch.int64 or not t.is_contiguous() or t.dim() != 1 for t in index) \
                or x.dtype != torch.float32 or batch.write_slots.shape[0] != rows \
                or batch.decode_page_offset.shape[0] != rows or batch.positions.shape[0] != x.shape[0]:
            raise KernelError("the C decode layers take float32 rows, one write slot and page offset "
                              "per request and contiguous 1-D int64 index tensors")
        # The adapter rows' deltas (bulkhead.model.lora_layers), or none.
        deltas = lora_layers.step_deltas(lora_layers.load(), batch.lora) if batch.lora is not None else None
        rc = fn(*head, ctypes.addressof(model), x.data_ptr(), x.shape[0], rows, batch.positions.data_ptr(),
                batch.write_slots.data_ptr(), batch.pages.data_ptr(), batch.pages.shape[0],
                batch.decode_page_offset.data_ptr(), batch.decode_kv_len.data_ptr(), torch.get_num_threads(),
                deltas and deltas.fn, deltas and ctypes.addressof(deltas.step), *tail)
        if rc > 0:
            raise decode_kernel.page_list_refused(rc - 1, model.num_pool_pages)
        if rc < 0:
            raise KernelError(f"the C decode layers refused the step: {ERRORS.get(rc, rc)}")
