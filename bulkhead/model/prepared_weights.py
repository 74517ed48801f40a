"""The model's weights laid out for the chosen kernels, cached per machine.

Why: laying out the bundled SmolLM2 for the default kernels means reading
its GGUF's codes, packing every linear weight twice (4-bit for decode rows,
bf16 for prompt rows) and the lm_head once: most of a warm start's time, in
each worker, every start, for the same answer. A start that finds this
machine's entry (bulkhead.model.machine_cache: keyed by the CPU, the model's
files, bulkhead/model's sources and the kernel asked for) reads the packed
tensors instead, and never holds the fp32 weights at all.

Only the C kernels' layouts are cached (`cacheable`): plain tensors, read
back onto huge pages (machine_cache._read_each), which a one-row decode step
streams. The exact fp32 paths, which lay weights out inside oneDNN, are
built from the fp32 weights on every start.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch

from bulkhead.model import bf16in_kernel, head_kernel, i16in_kernel, linear_kernel, machine_cache
from bulkhead.model import weight_format
from bulkhead.model.config import ModelConfig, load_model_config
from bulkhead.model.gguf_import import heartbeat
from bulkhead.model.bf16_embedding import BF16Embedding
from bulkhead.model.format_linear import CodedLinear
from bulkhead.model.head_linear import BF16InputHead
from bulkhead.model.linear_kernel import BF16InLinear, BF16Linear, BF16WeightLinear, Q8I16InLinear
from bulkhead.model.llama import LayerWeights, ModelWeights
from bulkhead.model.q8_embedding import Q8Embedding

log = logging.getLogger(__name__)

CACHED_HEADS = ("q8-i16in", "bf16w", "bf16-in")
LINEARS = ("qkv", "o", "gate_up", "down")
# The C libraries each cached kernel needs: a hit is used only where they load here.
LIBRARIES = {"q4-i16in": (bf16in_kernel, i16in_kernel), "gguf-i16in": (bf16in_kernel, i16in_kernel),
             "bf16": (bf16in_kernel,), "q8-i16in": (i16in_kernel,), "bf16w": (head_kernel,), "bf16-in": (bf16in_kernel,)}
# The kernels whose decode-only layout reads a GGUF's codes and never its values (linear_kernel.prepare_one).
CODES_ONLY = ("q4-i16in", "gguf-i16in")
# Counted for tests: how many builds read an entry and how many wrote one.
stats = {"hits": 0, "writes": 0}


def entry_name(model_dir: Path, dtype: torch.dtype, asked: str, runs: str = "both") -> str:
    # Each role's entry holds only its own packing (linear_kernel.prepare_one); "both" keeps the old key.
    role = {} if runs == "both" else {"runs": runs}
    return machine_cache.key("weights", model=machine_cache.model_identity(model_dir), dtype=str(dtype),
                             kernel=asked, **role)


def cacheable(kernel: str, head: str) -> bool:
    """Every kernel of the table's rows but the exact ones: plain tensors, which save() writes."""
    return kernel in linear_kernel.BF16_INPUT_PROMPTS and head in CACHED_HEADS


def load(model_dir: Path, dtype: torch.dtype, asked: str,
         runs: str = "both") -> tuple[ModelConfig, ModelWeights, str, str] | None:
    """(config, laid-out weights, kernel, lm_head kernel) from this machine's
    entry for `asked` (a --linear-kernel value) and `runs`, or None."""
    found = machine_cache.read_tensors(entry_name(model_dir, dtype, asked, runs))
    if found is None:
        return None
    tensors, meta = found
    kernel, head = meta["kernel"], meta["head"]
    if not all(lib.load() is not None for lib in (*LIBRARIES[kernel], *LIBRARIES[head])):
        return None
    formats = meta.get("formats", {})

    def linear(prefix: str):
        prompts = BF16InLinear(tensors[prefix + ".wb"]) if prefix + ".wb" in tensors else None
        if kernel == "bf16":  # one bf16 packing for both passes
            return BF16Linear(prompts)
        if prefix + ".qs" not in tensors:  # a prefill worker's: prompts only
            return prompts
        return CodedLinear.from_packed(formats[prefix], (tensors[prefix + ".qs"], tensors[prefix + ".dm"]), prompts)

    layers = [LayerWeights(input_norm=tensors[f"layers.{i}.input_norm"], qkv=linear(f"layers.{i}.qkv"),
                           qkv_bias=tensors.get(f"layers.{i}.qkv_bias"), o=linear(f"layers.{i}.o"),
                           post_norm=tensors[f"layers.{i}.post_norm"], gate_up=linear(f"layers.{i}.gate_up"),
                           down=linear(f"layers.{i}.down"))
              for i in range(meta["num_layers"])]
    lm_head = _head(tensors, head)
    stats["hits"] += 1
    return (load_model_config(model_dir),
            ModelWeights(embed=_embed(tensors, meta["embed"], lm_head), layers=layers,
                         final_norm=tensors["final_norm"], lm_head=lm_head),
            kernel, head)


def _head(tensors: dict, head: str):
    if head == "q8-i16in":
        return Q8I16InLinear((tensors["lm_head.qb"], tensors["lm_head.d"]))
    return (BF16InputHead if head == "bf16-in" else BF16WeightLinear)(tensors["lm_head.packed"])


# How save() kept the token embedding, by save's name for it (`embed` in the entry's metadata).
def _embed(tensors: dict, kind: str, lm_head):
    if kind == "lm_head-q8":  # tied under q8-i16in: rows rebuilt from the lm_head's 8-bit packing
        return Q8Embedding(lm_head.packed)
    if kind == "lm_head-bf16":  # tied under bf16-in: the lm_head's bf16 pairs
        return BF16Embedding(pairs=lm_head.packed)
    if kind == "bf16-rows":  # a bf16 checkpoint's own rows, widened on lookup
        return BF16Embedding(rows=tensors["embed"])
    return tensors["embed"]


def _embed_entry(embed) -> tuple[str, torch.Tensor | None]:
    """(_embed's name for how `embed` is kept, the tensor to write for it, if any)."""
    if isinstance(embed, Q8Embedding):
        return "lm_head-q8", None
    if isinstance(embed, BF16Embedding):
        return ("lm_head-bf16", None) if embed.rows is None else ("bf16-rows", embed.rows)
    return "tensor", embed


def _linear_tensors(prefix: str, w) -> tuple[dict, str | None]:
    """({name: tensor} of one laid-out layer, its decode kernel where it is a CodedLinear)."""
    prompts = w if isinstance(w, BF16InLinear) else w.prefill
    tensors = {} if prompts is None else {prefix + ".wb": prompts.wb}
    if isinstance(w, CodedLinear):
        tensors[prefix + ".qs"], tensors[prefix + ".dm"] = w.weights  # its own layout
        return tensors, w.format
    return tensors, None


def save(model_dir: Path, dtype: torch.dtype, asked: str, weights: ModelWeights, kernel: str, head: str,
         runs: str = "both") -> None:
    """Write the entry for `asked` and `runs` (laid-out weights of a cacheable kernel: each layer's
    decode packing and bf16 prompt packing, whichever of them `runs` laid out)."""
    embed_kind, embed = _embed_entry(weights.embed)
    tensors = {"final_norm": weights.final_norm} | ({} if embed is None else {"embed": embed})
    formats = {}
    for i, layer in enumerate(weights.layers):
        for name in ("input_norm", "post_norm", "qkv_bias"):
            if getattr(layer, name) is not None:
                tensors[f"layers.{i}.{name}"] = getattr(layer, name)
        for name in LINEARS:
            part, fmt = _linear_tensors(f"layers.{i}.{name}", getattr(layer, name))
            tensors |= part
            if fmt is not None:
                formats[f"layers.{i}.{name}"] = fmt
    if head == "q8-i16in":
        tensors["lm_head.qb"], tensors["lm_head.d"] = weights.lm_head.packed
    else:
        tensors["lm_head.packed"] = weights.lm_head.packed
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    machine_cache.write_tensors(entry_name(model_dir, dtype, asked, runs), tensors,
                                {"kernel": kernel, "head": head, "num_layers": len(weights.layers),
                                 "embed": embed_kind, "formats": formats})
    stats["writes"] += 1


def load_laid_out(model_dir: Path, dtype: torch.dtype, asked: str, head_asked: str | None = None,
                  runs: str = "both"):
    """(config, weights laid out for the kernel `asked` resolves to and the
    passes `runs` names (kernel_names.RUNS), kernel, lm_head kernel): from
    the cache where this machine has the entry, else from the fp32 weights
    (then cached where the kernels are cacheable). The fp32 weights are
    dropped once laid out."""
    if head_asked is not None:
        return _lay_out(model_dir, dtype, asked, head_asked, runs)
    name = entry_name(model_dir, dtype, asked, runs)
    hit = load(model_dir, dtype, asked, runs)
    if hit is None:
        with machine_cache.computing(name):  # a worker starting beside this one waits
            if (hit := load(model_dir, dtype, asked, runs)) is None:  # ... and then reads what the first one wrote
                return _lay_out(model_dir, dtype, asked, head_asked, runs)
    log.info("laid-out weights read from this machine's cache (%s kernel, %s lm_head, for %s)", hit[2], hit[3],
             runs)
    return hit


def _lay_out(model_dir: Path, dtype: torch.dtype, asked: str, head_asked: str | None, runs: str):
    mc, laid, kernel, head = _laid_out(model_dir, dtype, asked, head_asked, runs)
    if head_asked is None and cacheable(kernel, head):
        save(model_dir, dtype, asked, laid, kernel, head, runs)
        # The first start serves what the next ones do: the entry read back lies on huge pages
        # (machine_cache._read_each), torch's allocations do not; dropped first, so never two copies.
        del laid
        return load(model_dir, dtype, asked, runs) or _laid_out(model_dir, dtype, asked, head_asked, runs)
    return mc, laid, kernel, head


def _laid_out(model_dir: Path, dtype: torch.dtype, asked: str, head_asked: str | None, runs: str):
    from bulkhead.model.loader import GGUFLayers, load_weights

    log.info("loading %s and laying its weights out for the kernels, for %s (once per machine where they are "
             "cached)", Path(model_dir).name, runs)
    with heartbeat("laying the weights out", "decoding them as stored, then packing", log):
        mc, weights = load_weights(model_dir, dtype, lazy=True)  # a GGUF's layers decoded one at a time
        probe = weights
        if isinstance(weights.layers, GGUFLayers):  # the choice reads one layer of each mix of stored types
            probe = dataclasses.replace(weights, layers=weights.layers.representatives())
        kernel = linear_kernel.choose(asked, dtype, probe, weight_format.linear_format(model_dir))
        del probe
        head = linear_kernel.choose_head(kernel, weights.lm_head, head_asked)
        if isinstance(weights.layers, GGUFLayers) and runs == "decode" and kernel in CODES_ONLY:
            weights.layers.codes_only = True  # the decode packing reads the codes alone
        laid = linear_kernel.prepare(weights, kernel, head, release=True, runs=runs)  # never both whole
        del weights
    return mc, laid, kernel, head
