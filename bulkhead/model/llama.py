"""A Llama-family decoder (Llama, Qwen2, Mistral, SmolLM) over a paged KV cache.

One forward function serves prefill chunks and decode steps: the batch
(bulkhead.model.batch.PagedBatch) says which rows belong to which sequence and
where each sequence's KV pages are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bulkhead.model.attention import paged_attention
from bulkhead.model import decode_layers
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


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: ModelWeights, decode_attention: str = "torch",
                 decode_glue: str = "auto", prefill_attention: str = "torch"):
        """decode_attention: "c" (the C kernel over the pool, see
        bulkhead.model.decode_kernel.choose) or "torch". decode_glue: "c"
        runs a decode step's layers in one C call (bulkhead.model.decode_layers),
        "torch" through the ops below, "auto" the C call where it can run.
        prefill_attention: "bf16" (bulkhead.model.prefill_attention) or "torch"."""
        self.config = config
        self.weights = weights
        self.decode_attention = decode_attention
        self.prefill_attention = prefill_attention
        self.cos, self.sin = rope_tables(config.rope, config.head_dim, config.max_position_embeddings)
        if decode_glue not in decode_layers.CHOICES:
            raise ValueError(f"decode glue must be one of {decode_layers.CHOICES}, not {decode_glue!r}")
        why = None if decode_glue == "torch" else decode_layers.DecodeLayers.why_not(config, weights, decode_attention)
        usable = decode_glue != "torch" and why is None
        if decode_glue == "c" and not usable:
            raise RuntimeError(f"decode glue c cannot run: {why}")
        self._c_layers = decode_layers.DecodeLayers(config, weights, self.cos, self.sin, decode_layers.load()) \
            if usable else None

    @property
    def decode_glue(self) -> str:
        """What runs a decode step's layers around the kernels: "c" or "torch"."""
        return "c" if self._c_layers is not None else "torch"

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.embed.dtype

    @torch.inference_mode()
    def forward(self, batch: PagedBatch, kv_layers: list[tuple[torch.Tensor, torch.Tensor]],
                between_layers: Callable[[], None] | None = None) -> torch.Tensor:
        """Run one pass; returns logits [S, V] (float32) for batch.logit_rows.

        between_layers, if given, is called after every layer but the last:
        the engine may run another pass there (a short prompt that should not
        wait out this long one). The pass keeps all its state in locals, so
        pausing it changes none of its numbers.

        kv_layers[i] = (k, v) of layer i, each [num_pages, page_size, KVH, hd]
        views of the one pool tensor. This pass writes its real rows' K/V at
        batch.write_slots before any attention reads them.
        """
        cfg, w = self.config, self.weights
        x = w.embed[batch.token_ids]  # [T, D]
        # Not where decode rows are tiled (no batch-invariant row multiple
        # was measured): the C layers run every row through one matmul.
        if batch.decode and self._c_layers is not None and not batch.row_tile:
            x = self._c_layers.run(x, batch, kv_layers)
        else:
            x = self._torch_layers(x, batch, kv_layers, between_layers)
        x = _rms_norm(x[batch.logit_rows], w.final_norm, cfg.rms_norm_eps)
        return _linear(x, w.lm_head, None, batch).float()

    def _torch_layers(self, x: torch.Tensor, batch: PagedBatch, kv_layers: list[tuple[torch.Tensor, torch.Tensor]],
                      between_layers: Callable[[], None] | None) -> torch.Tensor:
        """Every layer, one torch op at a time: x [T, D] in, the last layer's output out."""
        cfg, w = self.config, self.weights
        cos = self.cos[batch.positions].unsqueeze(1).to(x.dtype)  # [T, 1, hd]
        sin = self.sin[batch.positions].unsqueeze(1).to(x.dtype)
        page_size = kv_layers[0][1].shape[1]
        # Where each real row's K/V goes: the same for every layer.
        slots = (batch.write_slots // page_size, batch.write_slots % page_size)  # page [N], offset [N]
        qk_size, qk_heads = cfg.q_size + cfg.kv_size, cfg.num_heads + cfg.num_kv_heads
        for layer, (k_pages, v_pages) in zip(w.layers, kv_layers):
            h = _rms_norm(x, layer.input_norm, cfg.rms_norm_eps)
            qkv = _linear(h, layer.qkv, layer.qkv_bias, batch)  # [T, (H + 2 * KVH) * hd]
            # Rotary on q and k in one pass: the same arithmetic per element as two.
            qk = apply_rope(qkv[:, :qk_size].view(-1, qk_heads, cfg.head_dim), cos, sin)  # [T, H + KVH, hd]
            q, k = qk.split([cfg.num_heads, cfg.num_kv_heads], dim=1)
            v = qkv[:, qk_size:].view(-1, cfg.num_kv_heads, cfg.head_dim)
            attn = paged_attention(q, k, v, k_pages, v_pages, batch, self.decode_attention == "c", slots,
                                   self.prefill_attention == "bf16")
            x = x + _linear(attn, layer.o, None, batch)
            h = _rms_norm(x, layer.post_norm, cfg.rms_norm_eps)
            gate, up = _linear(h, layer.gate_up, None, batch).chunk(2, dim=-1)
            x = x + _linear(F.silu(gate) * up, layer.down, None, batch)
            if between_layers is not None and layer is not w.layers[-1]:
                between_layers()
        return x
