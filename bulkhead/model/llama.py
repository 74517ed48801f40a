"""A Llama-family decoder (Llama, Qwen2, Mistral, SmolLM) over a paged KV cache.

One forward function serves prefill chunks and decode steps: the batch
(bulkhead.model.batch.PagedBatch) says which rows belong to which sequence and
where each sequence's KV pages are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bulkhead.model.attention import paged_attention
from bulkhead.model import decode_layers, lora_layers, prefill_glue
from bulkhead.model.batch import PagedBatch
from bulkhead.model.config import ModelConfig
from bulkhead.model.linear_kernel import Linear
from bulkhead.model.rope import apply_rope, rope_tables


@dataclass
class LayerWeights:
    # Linear weights are plain [out, in] tensors as loaded, and Linear
    # layers once laid out for a kernel (bulkhead.model.linear_kernel.prepare).
    input_norm: torch.Tensor  # [D]
    qkv: Linear  # [(H + 2 * KVH) * hd, D]  q, k, v projections fused
    qkv_bias: torch.Tensor | None
    o: Linear  # [D, H * hd]
    post_norm: torch.Tensor  # [D]
    gate_up: Linear  # [2 * I, D]  gate and up projections fused
    down: Linear  # [D, I]


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [V, D]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [D]
    lm_head: Linear  # [V, D]  (a laid-out copy of the embedding when tied)


def _linear(x: torch.Tensor, w: Linear, b: torch.Tensor | None, batch: PagedBatch) -> torch.Tensor:
    if batch.row_tile and x.shape[0] > batch.row_tile:
        return torch.cat([w(part, b, batch.decode) for part in x.split(batch.row_tile)])
    return w(x, b, batch.decode)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # One op instead of six (pow, mean, add, rsqrt, mul, mul): fewer per-op
    # overheads in a decode step. On this build its numbers equal the six
    # ops' bit for bit (measured at 1 and 16 rows of SmolLM2's width).
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _final_norm_after_c_layers():
    """The C glue's RMSNorm where its library loads, else torch's (LlamaModel.__init__ says why)."""
    return prefill_glue.rms_norm if prefill_glue.load() is not None else _rms_norm


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: ModelWeights, decode_attention: str = "torch",
                 decode_glue: str = "auto", prefill_attention: str = "torch", prefill_glue: str = "torch"):
        """decode_attention: "c" (the C kernel over the pool, see
        bulkhead.model.decode_kernel.choose) or "torch". decode_glue: "c"
        runs a decode step's layers in one C call (bulkhead.model.decode_layers),
        "torch" through the ops below, "auto" the C call where it can run.
        prefill_attention: "bf16" (bulkhead.model.prefill_attention) or "torch".
        prefill_glue: "c" (bulkhead.model.prefill_glue: prompt rows' norms,
        rotary and SiLU in C) or "torch", as prefill_glue.choose resolved it."""
        self.config = config
        self.weights = weights
        self.decode_attention = decode_attention
        self.prefill_attention = prefill_attention
        if prefill_glue not in ("c", "torch"):
            raise ValueError(f"prefill glue must be c or torch (prefill_glue.choose resolves auto), not {prefill_glue!r}")
        self.prefill_glue = prefill_glue
        self.cos, self.sin = rope_tables(config.rope, config.head_dim, config.max_position_embeddings)
        if decode_glue not in decode_layers.CHOICES:
            raise ValueError(f"decode glue must be one of {decode_layers.CHOICES}, not {decode_glue!r}")
        why = None if decode_glue == "torch" else decode_layers.DecodeLayers.why_not(config, weights, decode_attention)
        usable = decode_glue != "torch" and why is None
        if decode_glue == "c" and not usable:
            raise RuntimeError(f"decode glue c cannot run: {why}")
        self._c_layers = decode_layers.DecodeLayers(config, weights, self.cos, self.sin, decode_layers.load()) \
            if usable else None
        # After the C layers, their final RMSNorm in C too (csrc/glue.h's, the
        # layers' own): the weights streamed through the pass leave torch's
        # dispatch cold, and F.rms_norm then cost ~130-240 us a pass
        # (docs/performance.md). Torch's where the C glue cannot load.
        self._c_final_norm = _final_norm_after_c_layers() if usable else _rms_norm
        # Adapter rows take the C delta over packed bf16 adapters wherever a
        # reduced-precision pass runs: beside the C decode layers, and on a
        # prompts-only worker (no decode layers, the C prompt glue), whose
        # prompts through the fp32 torch delta took 2.3x the base's time to
        # first token. The exact path keeps lora_rows over fp32 adapters. Fixed
        # per process, so a row's path never depends on its batch.
        self._c_adapters = lora_layers.load() is not None and (usable or self.prefill_glue == "c")

    @property
    def decode_glue(self) -> str:
        """What runs a decode step's layers around the kernels: "c" or "torch"."""
        return "c" if self._c_layers is not None else "torch"

    @property
    def adapter_packing(self):
        """How a worker holds adapters for this model (bulkhead.engine.adapter_store's
        pack): only packed, where every pass reads the packed copy (_adapter_deltas)."""
        return lora_layers.pack_only if self._c_adapters else None

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.embed.dtype

    @property
    def decode_tail_in_c(self) -> bool:
        """Whether a decode pass through the C layers runs the lm_head, the
        finite check and the greedy picks in the same call (forward's `tail`)."""
        return self._c_layers is not None and self._c_layers.runs_head

    @torch.inference_mode()
    def forward(self, batch: PagedBatch, kv_layers: list[tuple[torch.Tensor, torch.Tensor]],
                tail: list | None = None) -> torch.Tensor:
        """Run one whole pass; returns logits [S, V] (float32) for batch.logit_rows.

        kv_layers[i] = (k, v) of layer i, each [num_pages, page_size, KVH, hd]
        views of the one pool tensor. This pass writes its real rows' K/V at
        batch.write_slots before any attention reads them. tail: where given
        and the pass's tail ran in C (decode_tail_in_c), the pass appends its
        decode_layers.StepTail (each request row's greedy pick, and whether
        their logits are all finite); otherwise left empty.
        """
        # Not where decode rows are tiled (no batch-invariant row multiple
        # was measured): the C layers run every row through one matmul.
        # Adapter rows too, where the C delta builds (bulkhead.model.lora_layers).
        if batch.decode and self._c_layers is not None and not batch.row_tile \
                and (batch.lora is None or self._c_adapters):
            x = self.weights.embed[batch.token_ids]
            if self._c_layers.runs_head:
                logits, found = self._c_layers.step(x, batch, kv_layers)
                if tail is not None:
                    tail.append(found)
                return logits
            x = self._c_layers.run(x, batch, kv_layers)
            return self._head(x, batch, self._c_final_norm)
        state = self._torch_layers(self.start_pass(batch), batch, kv_layers, 0, self.config.num_layers)
        return self._head(state.x, batch)

    # A prompt pass in slices of layers (bulkhead.engine.pass_slices): the
    # runner calls start_pass, run_layers once per slice, finish_pass. The
    # same ops as forward, layer after layer, so the same numbers.
    @torch.inference_mode()
    def start_pass(self, batch: PagedBatch) -> PassState:
        return PassState(self.weights.embed[batch.token_ids], None)  # x [T, D]

    @torch.inference_mode()
    def run_layers(self, batch: PagedBatch, kv_layers: list[tuple[torch.Tensor, torch.Tensor]], state: PassState,
                   start: int, stop: int) -> PassState:
        """Layers [start, stop) of a pass that has run [0, start)."""
        return self._torch_layers(state, batch, kv_layers, start, stop)

    @torch.inference_mode()
    def finish_pass(self, batch: PagedBatch, state: PassState) -> torch.Tensor:
        """The logits of a pass whose every layer has run: [S, V] float32."""
        return self._head(state.x, batch)

    def _head(self, x: torch.Tensor, batch: PagedBatch, norm=_rms_norm) -> torch.Tensor:
        # A decode pass wants every row's logits, in order (padding rows too:
        # PagedBatch.logit_rows), so the gather would only copy x.
        x = norm(x if batch.decode else x[batch.logit_rows], self.weights.final_norm, self.config.rms_norm_eps)
        return _linear(x, self.weights.lm_head, None, batch).float()

    def _last_layer_logit_rows(self, x: torch.Tensor, attn: torch.Tensor, layer: LayerWeights, batch: PagedBatch,
                               glue: _CGlue) -> PassState:
        """The last layer after its attention, for the rows whose logits are
        wanted only: nothing reads the others' output (_head takes
        logit_rows), and their K and V are written. Saves the o, gate_up and
        down projections of every other row, ~2% of a 256-token prompt pass.
        Under the C glue each row's norms and SiLU are its own, and so are its
        linears on the bf16 prompt kernels (the default's), so a logit row's
        numbers are the whole pass's bit for bit (`q4`'s oneDNN prompts, whose
        prompts never share a pass, take a matmul of the logit rows: still the
        same numbers whatever else is in the step); x's other rows keep the
        layer's input. Not under adapters (their deltas index the pass's rows)."""
        rows = batch.logit_rows
        part = x[rows]  # [S, D] a copy, which the C glue adds into
        part, h = glue.add_rms_norm(part, _linear(attn[rows], layer.o, None, batch), layer.post_norm)
        down = _linear(glue.gate_up_silu_mul(h, layer.gate_up, batch), layer.down, None, batch)
        x[rows] = part + down
        return PassState(x, None)

    def _adapter_deltas(self, batch: PagedBatch):
        """Where adapter rows take the C delta (_c_adapters), the same bf16
        weights (bulkhead.model.lora_layers) for a request's prompt and decode
        steps, one copy of its adapter; elsewhere (the exact path)
        bulkhead.model.lora_rows over fp32 weights. None: no row has an adapter."""
        if batch.lora is None or not self._c_adapters:
            return batch.lora
        return lora_layers.StepDeltas(lora_layers.load(), batch.lora)

    def _torch_layers(self, state: PassState, batch: PagedBatch, kv_layers: list[tuple[torch.Tensor, torch.Tensor]],
                      start: int, stop: int) -> PassState:
        """Layers [start, stop), one torch op (or, for prompt rows under
        prefill_glue "c", one C call) at a time."""
        cfg, w = self.config, self.weights
        glue = _CGlue(self, batch) if self.prefill_glue == "c" and not batch.decode and state.x.dtype == torch.float32 \
            else _TorchGlue(self, batch, state.x.dtype)
        page_size = kv_layers[0][1].shape[1]
        # Where each real row's K/V goes: the same for every layer.
        slots = (batch.write_slots // page_size, batch.write_slots % page_size)  # page [N], offset [N]
        qk_size, qk_heads = cfg.q_size + cfg.kv_size, cfg.num_heads + cfg.num_kv_heads
        if start == 0:
            x = state.x.contiguous()
            h = glue.rms_norm(x, w.layers[0].input_norm)
        else:
            x, h = state.x, state.h
        lora = self._adapter_deltas(batch)  # each row's adapter delta after each base matmul
        for i in range(start, stop):
            layer, (k_pages, v_pages) = w.layers[i], kv_layers[i]
            qkv = _linear(h, layer.qkv, layer.qkv_bias, batch)  # [T, (H + 2 * KVH) * hd]
            if lora is not None:
                lora.add(i, "qkv", h, qkv)
            qk = glue.rope(qkv, qk_heads)  # [T, H + KVH, hd]
            q, k = qk.split([cfg.num_heads, cfg.num_kv_heads], dim=1)
            v = qkv[:, qk_size:].view(-1, cfg.num_kv_heads, cfg.head_dim)
            attn = paged_attention(q, k, v, k_pages, v_pages, batch, self.decode_attention == "c", slots,
                                   self.prefill_attention == "bf16")
            if i == cfg.num_layers - 1 and lora is None and isinstance(glue, _CGlue):
                return self._last_layer_logit_rows(x, attn, layer, batch, glue)
            o = _linear(attn, layer.o, None, batch)
            x, h = glue.add_rms_norm(x, o if lora is None else lora.add(i, "o", attn, o), layer.post_norm)
            if lora is not None and lora.touches(i, "gate_up"):  # the delta goes in before SiLU: no fused kernel
                act = glue.silu_mul(lora.add(i, "gate_up", h, _linear(h, layer.gate_up, None, batch)))
            else:
                act = glue.gate_up_silu_mul(h, layer.gate_up, batch)
            down = _linear(act, layer.down, None, batch)
            if lora is not None:
                lora.add(i, "down", act, down)
            if i == cfg.num_layers - 1:
                return PassState(x + down, None)
            # The residual add and the next layer's input norm in one pass.
            x, h = glue.add_rms_norm(x, down, w.layers[i + 1].input_norm)
        return PassState(x, h)


@dataclass
class PassState:
    """A pass's rows between two slices of its layers (the runner keeps it)."""

    # [T, D] the residual stream after the last layer run (the pass's own
    # tensor); after the model's last layer under the C glue, only in
    # batch.logit_rows (LlamaModel._last_layer_logit_rows).
    x: torch.Tensor
    h: torch.Tensor | None  # [T, D] x normed for the next layer's input; None after the last layer


class _TorchGlue:
    """A pass's ops around its matmuls and attention, as torch ops."""

    def __init__(self, model: LlamaModel, batch: PagedBatch, dtype: torch.dtype):
        self.eps, self.head_dim = model.config.rms_norm_eps, model.config.head_dim
        self.cos = model.cos[batch.positions].unsqueeze(1).to(dtype)  # [T, 1, hd]
        self.sin = model.sin[batch.positions].unsqueeze(1).to(dtype)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return _rms_norm(x, weight, self.eps)

    def rope(self, qkv: torch.Tensor, heads: int) -> torch.Tensor:
        # Rotary on q and k in one pass: the same arithmetic per element as two.
        return apply_rope(qkv[:, : heads * self.head_dim].view(-1, heads, self.head_dim), self.cos, self.sin)

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor):
        x = x + delta
        return x, _rms_norm(x, weight, self.eps)

    def gate_up_silu_mul(self, h: torch.Tensor, gate_up: Linear, batch: PagedBatch) -> torch.Tensor:
        return self.silu_mul(_linear(h, gate_up, None, batch))

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class _CGlue:
    """The same ops for a prompt pass's rows in C (bulkhead.model.prefill_glue);
    the residual is added into x in place (x is the pass's own tensor)."""

    def __init__(self, model: LlamaModel, batch: PagedBatch):
        self.eps, self.head_dim = model.config.rms_norm_eps, model.config.head_dim
        self.cos, self.sin, self.positions = model.cos, model.sin, batch.positions

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return prefill_glue.rms_norm(x, weight, self.eps)

    def rope(self, qkv: torch.Tensor, heads: int) -> torch.Tensor:
        return prefill_glue.rope(qkv.contiguous(), heads, self.head_dim, self.positions, self.cos, self.sin)

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor):
        return x, prefill_glue.add_rms_norm(x, delta.contiguous(), weight, self.eps)

    def gate_up_silu_mul(self, h: torch.Tensor, gate_up: Linear, batch: PagedBatch) -> torch.Tensor:
        # The prompt kernel's one pass where it has one (Linear.silu_mul):
        # the same numbers, without the [T, 2 I] matmul output.
        act = gate_up.silu_mul(h)  # prompt rows only: _CGlue never runs a decode pass
        return act if act is not None else self.silu_mul(_linear(h, gate_up, None, batch))

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return prefill_glue.silu_mul(gate_up.contiguous())
