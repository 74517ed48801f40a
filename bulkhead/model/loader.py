"""Load a model directory into bulkhead's fused weights: a Hugging Face
safetensors directory, or one whose weights stay in a GGUF file
(bulkhead.model.gguf_import.GGUF_POINTER), read as stored
(bulkhead.model.gguf_weights) with the stored codes handed to the kernels."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

from bulkhead.model import gguf_weights
from bulkhead.model.config import ModelConfig, load_model_config
from bulkhead.model.gguf_import import gguf_pointer
from bulkhead.model.linear_kernel import HELD_AS_STORED, prepare
from bulkhead.model.llama import LayerWeights, LlamaModel, ModelWeights


def _read_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def read_tensors(model_dir: Path, num_heads: int, num_kv_heads: int) -> dict[str, torch.Tensor]:
    """{Hugging Face name: tensor} of a model directory: a GGUF's in fp32,
    exactly gguf-py's dequantize (q/k rows in Hugging Face's order)."""
    pointer = gguf_pointer(model_dir)
    if pointer is None:
        return _read_tensors(Path(model_dir))
    decoded = gguf_weights.read(pointer["gguf"], num_heads, num_kv_heads, pointer.get("table"))
    return {name: d.values() for name, d in decoded.items()}


def held_as_stored(t: torch.Tensor, dtype: torch.dtype) -> bool:
    """A bf16 or fp16 matrix under an fp32 model: loaded as stored (build_weights says why)."""
    return dtype == torch.float32 and t.dtype in HELD_AS_STORED and t.dim() == 2


def _taker(tensors: dict[str, torch.Tensor], dtype: torch.dtype, mapped: bool):
    def take(name: str, own: bool = True) -> torch.Tensor:
        """The tensor in `dtype`, but for a bf16 or fp16 matrix under an fp32
        model, which stays as stored and uncopied: linear_kernel.prepare lays
        each one out, so the model is never held whole in fp32 (a 1B model's
        4.3 GB; two such workers ran out of memory). own=True copies the rest
        out of the file's mapping where it still reads it, so that the whole
        mapping goes once the weights are laid out (an embedding that kept it
        alive held the file's 540 MB resident in every worker). own=False:
        the caller copies it (torch.cat). mapped=False: `tensors` are in
        memory of their own (a GGUF's, decoded), none is copied."""
        try:
            t = tensors.pop(name)
        except KeyError:
            raise KeyError(f"checkpoint lacks tensor {name!r}") from None
        if held_as_stored(t, dtype):
            return t.contiguous()
        out = t.to(dtype).contiguous()
        return out.clone() if mapped and own and out.data_ptr() == t.data_ptr() else out

    return take


def _build_layer(config: ModelConfig, i: int, take) -> LayerWeights:
    p = f"model.layers.{i}."
    qkv = torch.cat([take(p + f"self_attn.{n}_proj.weight", own=False) for n in "qkv"])
    bias = None
    if config.qkv_bias:
        bias = torch.cat([take(p + f"self_attn.{n}_proj.bias", own=False) for n in "qkv"])
    return LayerWeights(
        input_norm=take(p + "input_layernorm.weight"),
        qkv=qkv,
        qkv_bias=bias,
        o=take(p + "self_attn.o_proj.weight"),
        post_norm=take(p + "post_attention_layernorm.weight"),
        gate_up=torch.cat([take(p + f"mlp.{n}_proj.weight", own=False) for n in ("gate", "up")]),
        down=take(p + "mlp.down_proj.weight"),
    )


def _build_top(config: ModelConfig, tensors: dict[str, torch.Tensor], take, layers) -> ModelWeights:
    embed = take("model.embed_tokens.weight")
    if config.tie_word_embeddings or "lm_head.weight" not in tensors:
        lm_head = embed
    else:
        lm_head = take("lm_head.weight")
    return ModelWeights(embed=embed, layers=layers, final_norm=take("model.norm.weight"), lm_head=lm_head)


def build_weights(config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                  mapped: bool = True) -> ModelWeights:
    """The model's plain weights from {Hugging Face name: tensor} (each taken
    out of `tensors`; _taker says what is copied)."""
    take = _taker(tensors, dtype, mapped)
    layers = [_build_layer(config, i, take) for i in range(config.num_layers)]
    return _build_top(config, tensors, take, layers)


class GGUFLayers(Sequence):
    """A GGUF-backed model's layers, each decoded from the file when asked
    for and not kept: linear_kernel.prepare(release=True) lays them out one
    at a time, so a start holds one layer's fp32 values and codes beside the
    laid-out weights, not the whole model's (a 1B Q4_0 peaked at 7.2 GB, its
    laid-out weights 2.6 GB). `representatives` gives the kernel choice one
    layer per distinct mix of stored types.

    codes_only: a coded matrix's values are a placeholder of its shape on
    torch's "meta" device, carrying its codes (format_linear.remember) and
    no numbers: for a layout that reads only codes (a decode worker's), which
    then never writes the fp32 values (4 bytes a weight, most of its start)."""

    def __init__(self, f: gguf_weights.GGUFFile, config: ModelConfig, dtype: torch.dtype):
        self._f, self._config, self._dtype = f, config, dtype
        self.codes_only = False

    def __len__(self) -> int:
        return self._config.num_layers

    def __getitem__(self, i: int) -> LayerWeights:
        if not 0 <= i < len(self):
            raise IndexError(i)
        c = self._config
        decoded = {name: self._f.decoded(name, c.num_heads, c.num_kv_heads) for name in self._f.tensors
                   if name.startswith(f"model.layers.{i}.")}
        layer = _build_layer(c, i, _taker({n: self._values(d) for n, d in decoded.items()}, self._dtype, False))
        gguf_weights.remember_layer_codes(layer, i, decoded)
        return layer

    def _values(self, d) -> torch.Tensor:
        if self.codes_only and hasattr(d, "q"):  # Q4Codes, Q8Codes, Q8ACodes: q [N, K / 32, 32]
            return torch.empty(d.q.shape[0], d.q.shape[1] * d.q.shape[2], device="meta")
        return d.values()

    def __setitem__(self, i: int, value) -> None:
        """prepare(release=True) drops a laid-out layer: nothing is held here to drop."""

    def signature(self, i: int) -> tuple[str, ...]:
        """The stored types of layer i's tensors, by name."""
        prefix = f"model.layers.{i}."
        return tuple(sorted(f"{n[len(prefix):]}={t}" for n, t in self._f.formats().items() if n.startswith(prefix)))

    def representatives(self) -> list[LayerWeights]:
        """One layer per distinct signature: the kernel choice
        (linear_kernel.choose) depends on each layer's stored types and shapes,
        the same in every layer of a signature."""
        firsts = {}
        for i in range(len(self)):
            firsts.setdefault(self.signature(i), i)
        return [self[i] for i in sorted(firsts.values())]


def _gguf_weights(config: ModelConfig, pointer: dict, dtype: torch.dtype) -> ModelWeights:
    """A GGUF's weights with lazily decoded layers (GGUFLayers) and the
    embedding, lm_head and final norm decoded now."""
    f = gguf_weights.GGUFFile(pointer["gguf"], pointer.get("table"))
    top = {name: f.decoded(name, config.num_heads, config.num_kv_heads) for name in f.tensors
           if not name.startswith("model.layers.")}
    tensors = {name: d.values() for name, d in top.items()}
    weights = _build_top(config, tensors, _taker(tensors, dtype, False), GGUFLayers(f, config, dtype))
    gguf_weights.remember_head_codes(weights, top)
    return weights


def load_weights(model_dir: Path, dtype: torch.dtype = torch.float32,
                 lazy: bool = False) -> tuple[ModelConfig, ModelWeights]:
    """The config and the plain (not yet laid-out) weights of a directory.
    lazy=True: a GGUF's layers as GGUFLayers (decoded one at a time, as laid out)."""
    model_dir = Path(model_dir)
    config = load_model_config(model_dir)
    pointer = gguf_pointer(model_dir)
    if pointer is None:
        return config, build_weights(config, _read_tensors(model_dir), dtype)
    weights = _gguf_weights(config, pointer, dtype)
    return config, weights if lazy else dataclasses.replace(weights, layers=list(weights.layers))


def load_model(model_dir: Path, dtype: torch.dtype = torch.float32, linear_kernel: str = "aten",
               decode_attention: str = "torch", head_kernel: str | None = None,
               decode_glue: str = "auto", prefill_attention: str = "torch",
               prefill_glue: str = "torch") -> LlamaModel:
    """linear_kernel: a chosen kernel of bulkhead.model.linear_kernel ("aten",
    "onednn", ...); decode_attention: "c" or "torch" (LlamaModel);
    head_kernel: the lm_head's ("fp32", "bf16w", "q8-i16in"; None: the kernel's default);
    decode_glue: "auto", "c" or "torch"; prefill_attention: "bf16" or "torch";
    prefill_glue: "c" or "torch" (LlamaModel)."""
    config, weights = load_weights(model_dir, dtype)
    return LlamaModel(config, prepare(weights, linear_kernel, head_kernel), decode_attention,
                      decode_glue, prefill_attention, prefill_glue)
