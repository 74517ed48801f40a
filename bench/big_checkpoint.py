"""A ~1B-parameter Llama with real shapes and random weights (issue 35 item 5).

    python bench/big_checkpoint.py OUT      # OUT/bf16/ (safetensors) and OUT/big.Q4_0.gguf (~3 GB in all)
    LLAMA_QUANTIZE=bench/.llama-cpp/bin/llama-quantize python bench/big_checkpoint.py OUT --skip bf16,q4_0
                                            # OUT/big.BF16.gguf and OUT/big.Q4_K_M.gguf from it

Llama-3.2-1B's shapes (hidden 2048, 16 layers, 32 heads of 64, 8 KV heads,
intermediate 8192, tied embeddings: 1.07B parameters with SmolLM2's vocabulary
of 49152) and SmolLM2's tokenizer, so that text round-trips and throughput
means what it means on a real model of that size; the answers are noise, so
measure with `ignore_eos`. Every matrix is Gaussian with std STD (Llama's
initializer range): normalised inputs then give activations and logits of
order 1, finite in bf16. Each tensor is drawn from its own seed, so the
safetensors and the GGUF files hold the same weights (the GGUF's quantized):

- `bf16/`: bf16 safetensors in shards of SHARD_LAYERS layers with an index,
  config.json and the tokenizer: what a user downloads from a model hub.
- `big.Q4_0.gguf`: linear layers Q4_0 (gguf-py's quantizer), token_embd Q8_0,
  norms F32, the bundled GGUF's tokenizer metadata; q and k rows permuted as
  llama.cpp's convert_hf_to_gguf.py does (its rotary pairs are interleaved).
- `big.BF16.gguf`: every matrix in BF16, the input `llama-quantize` takes.
- `big.Q4_K_M.gguf`: `llama-quantize big.BF16.gguf big.Q4_K_M.gguf Q4_K_M`,
  only where the environment variable LLAMA_QUANTIZE names the tool
  (bench/setup_llama.sh builds it beside llama-server).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench.checkpoints import _write, copy_fields  # noqa: E402
from bulkhead.model.gguf_import import bundled_gguf_path, default_model_dir  # noqa: E402

STD = 0.02  # every matrix's; Llama's initializer_range
SHARD_LAYERS = 4  # layers per safetensors shard: ~0.5 GB each, the writer's peak memory
VOCAB = 49152  # SmolLM2's tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


@dataclass(frozen=True)
class Shape:
    hidden: int = 2048
    layers: int = 16
    heads: int = 32
    kv_heads: int = 8
    ff: int = 8192
    rope_theta: float = 500000.0
    context: int = 8192

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def parameters(self) -> int:
        hd = self.head_dim
        per_layer = self.hidden * hd * (2 * self.heads + 2 * self.kv_heads) + 3 * self.hidden * self.ff
        return VOCAB * self.hidden + self.layers * (per_layer + 2 * self.hidden) + self.hidden


LLAMA_3_2_1B = Shape()
# (Hugging Face name, GGUF name, rows, columns) of each layer's matrices; None = a norm.
LAYER_TENSORS = (
    ("self_attn.q_proj", "attn_q", "q", "h"), ("self_attn.k_proj", "attn_k", "kv", "h"),
    ("self_attn.v_proj", "attn_v", "kv", "h"), ("self_attn.o_proj", "attn_output", "h", "q"),
    ("mlp.gate_proj", "ffn_gate", "ff", "h"), ("mlp.up_proj", "ffn_up", "ff", "h"),
    ("mlp.down_proj", "ffn_down", "h", "ff"),
)
NORMS = (("input_layernorm", "attn_norm"), ("post_attention_layernorm", "ffn_norm"))


def dims(shape: Shape, rows: str) -> int:
    return {"h": shape.hidden, "q": shape.heads * shape.head_dim, "kv": shape.kv_heads * shape.head_dim,
            "ff": shape.ff}[rows]


def matrix(name: str, rows: int, cols: int, seed: int):
    """A bf16 [rows, cols] tensor of std STD, from a seed of its own name."""
    import torch

    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return (torch.randn((rows, cols), generator=gen) * STD).bfloat16()


def tensors(shape: Shape, seed: int, layers: range) -> Iterator[tuple[str, str, object]]:
    """(Hugging Face name, GGUF name, bf16 tensor) for `layers`; the embedding
    and the final norm with layer 0."""
    import torch

    if 0 in layers:
        yield "model.embed_tokens.weight", "token_embd.weight", matrix("embed", VOCAB, shape.hidden, seed)
        yield "model.norm.weight", "output_norm.weight", torch.ones(shape.hidden, dtype=torch.bfloat16)
    for i in layers:
        for hf, gg, rows, cols in LAYER_TENSORS:
            w = matrix(f"{i}.{hf}", dims(shape, rows), dims(shape, cols), seed)
            yield f"model.layers.{i}.{hf}.weight", f"blk.{i}.{gg}.weight", w
        for hf, gg in NORMS:
            yield f"model.layers.{i}.{hf}.weight", f"blk.{i}.{gg}.weight", torch.ones(shape.hidden,
                                                                                      dtype=torch.bfloat16)


def hf_config(shape: Shape) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": shape.hidden,
            "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim, "intermediate_size": shape.ff,
            "vocab_size": VOCAB, "max_position_embeddings": shape.context, "rope_theta": shape.rope_theta,
            "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": True, "bos_token_id": 1,
            "eos_token_id": 2, "pad_token_id": 2, "torch_dtype": "bfloat16", "attention_bias": False,
            "mlp_bias": False, "bulkhead_random_weights": asdict(shape)}


def write_safetensors(out: Path, shape: Shape = LLAMA_3_2_1B, seed: int = 0) -> Path:
    """The bf16 checkpoint (module doc), sharded with an index as the hubs' are."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    starts = range(0, shape.layers, SHARD_LAYERS)
    weight_map, total = {}, 0
    for n, start in enumerate(starts):
        name = f"model-{n + 1:05d}-of-{len(starts):05d}.safetensors"
        shard = {hf: t for hf, _, t in tensors(shape, seed, range(start, min(start + SHARD_LAYERS, shape.layers)))}
        save_file(shard, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        total += sum(t.numel() * 2 for t in shard.values())
        del shard
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                  "weight_map": weight_map}, indent=1))
    (out / "config.json").write_text(json.dumps(hf_config(shape), indent=2))
    for f in TOKENIZER_FILES:
        if (default_model_dir() / f).exists():
            shutil.copy(default_model_dir() / f, out / f)
    return out


def permute_rotary(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rotary halves interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(dst: Path, shape: Shape = LLAMA_3_2_1B, seed: int = 0, linear_type: str = "Q4_0",
               embed_type: str = "Q8_0") -> Path:
    """The same weights as a GGUF (module doc); linear_type and embed_type are gguf-py quantizer types."""
    import gguf

    writer = gguf.GGUFWriter(dst, "llama")
    copy_fields(gguf.GGUFReader(bundled_gguf_path()), writer, skip=("general.", "llama."))
    writer.add_name(f"random-llama-{shape.parameters() / 1e9:.2f}B")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ff)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    writer.add_rope_dimension_count(shape.head_dim)
    for hf, name, t in tensors(shape, seed, range(shape.layers)):
        w = t.float().numpy()
        if w.ndim == 1:
            writer.add_tensor(name, w)
            continue
        if hf.endswith("q_proj.weight"):
            w = permute_rotary(w, shape.heads)
        elif hf.endswith("k_proj.weight"):
            w = permute_rotary(w, shape.kv_heads)
        qtype = gguf.GGMLQuantizationType[embed_type if name == "token_embd.weight" else linear_type]
        writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    _write(writer)
    return dst


def quantize_k(src: Path, dst: Path, tool: str, kind: str = "Q4_K_M") -> Path:
    """llama.cpp's own quantizer (K-quants: gguf-py cannot write them)."""
    subprocess.run([tool, str(src), str(dst), kind], check=True)
    return dst


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", default="", help="comma list of bf16,q4_0,q4_k_m to leave out")
    args = ap.parse_args(argv)
    skip = set(args.skip.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{LLAMA_3_2_1B.parameters() / 1e9:.3f}B parameters", flush=True)
    if "bf16" not in skip:
        print(write_safetensors(args.out / "bf16", seed=args.seed), flush=True)
    if "q4_0" not in skip:
        print(write_gguf(args.out / "big.Q4_0.gguf", seed=args.seed), flush=True)
    tool = os.environ.get("LLAMA_QUANTIZE")
    if "q4_k_m" not in skip:
        if not tool:
            print("LLAMA_QUANTIZE unset: no Q4_K_M (bench/setup_llama.sh builds llama-quantize)", flush=True)
        else:
            bf16_gguf = write_gguf(args.out / "big.BF16.gguf", seed=args.seed, linear_type="BF16",
                                   embed_type="BF16")
            print(quantize_k(bf16_gguf, args.out / "big.Q4_K_M.gguf", tool), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
