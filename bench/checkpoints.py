"""Checkpoints in the formats users bring, made from the bundled SmolLM2 (issue 35).

    python bench/checkpoints.py q4_0 OUT.gguf   # the bundled Q4_1 file requantized to Q4_0
    python bench/checkpoints.py bf16 OUT_DIR    # the bundled model as bf16 safetensors, on no 4-bit grid

`q4_0`: every Q4_1 tensor of the bundled GGUF (the linear layers)
dequantized and requantized with gguf-py's Q4_0 quantizer, the rest (the
Q8_0 token embedding, the F32 norms) copied as stored, every metadata field
kept: what the issue's llama-server row ran. Serve it as it is (`bulkhead
serve --model OUT.gguf`: its tensors are read as stored), or after `bulkhead
convert` (`import_gguf` below: a dequantized fp32 directory).

`bf16`: the bundled model's tensors with Gaussian noise of NOISE times each
tensor's standard deviation added, saved in bf16 with the tokenizer: a
checkpoint of the same shapes whose weights lie on no 4-bit grid (what a
user downloads from a model hub), as the issue's bf16 rows ran.

`write_gguf` builds a small GGUF of any shape with the bundled file's
tokenizer, for the tests (tests/model/test_weight_format.py).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bulkhead.model.gguf_import import bundled_gguf_path, convert_gguf, default_model_dir  # noqa: E402

NOISE = 0.05  # of each tensor's standard deviation: off any 4-bit grid, the answers still the model's
# Written by GGUFWriter itself (the architecture) or derived from what is written (the counts).
GENERATED_FIELDS = ("GGUF.", "general.architecture")


def copy_fields(reader, writer, skip: tuple[str, ...] = ()) -> None:
    """Every metadata field of `reader` into `writer`, as stored, but those starting with `skip`."""
    import gguf

    for key, field in reader.fields.items():
        if key.startswith(GENERATED_FIELDS + skip):
            continue
        vtype = field.types[0]
        value = field.contents()
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, vtype, sub_type=sub)


def requantize_gguf(src: Path, dst: Path, to: str = "Q4_0", take: tuple[str, ...] = ("Q4_1",)) -> Path:
    """`src` with every tensor stored in a type named in `take` requantized to `to`."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    writer = gguf.GGUFWriter(dst, arch)
    copy_fields(reader, writer)
    target = gguf.GGMLQuantizationType[to]
    for t in reader.tensors:
        if t.tensor_type.name in take:
            values = gguf.quants.dequantize(t.data, t.tensor_type)
            writer.add_tensor(t.name, gguf.quants.quantize(values, target), raw_dtype=target)
        else:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    _write(writer)
    return dst


def write_gguf(dst: Path, linear_type: str, layers: int = 2, hidden: int = 64, ff: int = 128, heads: int = 4,
               kv_heads: int = 2, seed: int = 0, types: dict[str, str] | None = None) -> Path:
    """A random Llama of these shapes as a GGUF: linear weights in `linear_type`
    (gguf-py's quantizer), the token embedding Q8_0 (tied lm_head), norms F32,
    the bundled file's tokenizer and chat template. `types`: a GGUF type per
    matrix kind instead ({"ffn_down": "BF16", "token_embd": "F16", ...})."""
    import gguf

    src = gguf.GGUFReader(bundled_gguf_path())
    vocab = int(src.fields["llama.vocab_size"].contents())
    writer = gguf.GGUFWriter(dst, "llama")
    copy_fields(src, writer, skip=("general.", "llama."))
    writer.add_context_length(512)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(hidden // heads)
    rng = np.random.default_rng(seed)
    q8, lin = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType[linear_type]

    def quantized(name: str, rows: int, cols: int, qtype) -> None:
        w = (rng.standard_normal((rows, cols)) * 0.08).astype(np.float32)
        kind = name.split(".")[-2]
        qtype = gguf.GGMLQuantizationType[types[kind]] if types and kind in types else qtype
        writer.add_tensor(name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)

    quantized("token_embd.weight", vocab, hidden, q8)
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    hd = hidden // heads
    for i in range(layers):
        for name, rows, cols in (("attn_q", heads * hd, hidden), ("attn_k", kv_heads * hd, hidden),
                                 ("attn_v", kv_heads * hd, hidden), ("attn_output", hidden, heads * hd),
                                 ("ffn_gate", ff, hidden), ("ffn_up", ff, hidden), ("ffn_down", hidden, ff)):
            quantized(f"blk.{i}.{name}.weight", rows, cols, lin)
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
    _write(writer)
    return dst


def _write(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def bf16_checkpoint(out: Path, model_dir: Path | None = None, noise: float = NOISE, seed: int = 0,
                    dtype=None) -> Path:
    """The model at `model_dir` (the bundled SmolLM2) as bf16 safetensors with noise added (module doc);
    dtype: torch.float16 or float32 for the same weights stored so (off the bf16 grid too)."""
    import torch
    from safetensors.torch import save_file

    from bulkhead.model.config import load_model_config
    from bulkhead.model.loader import read_tensors

    model_dir = Path(model_dir or default_model_dir())
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    mc = load_model_config(model_dir)
    tensors = read_tensors(model_dir, mc.num_heads, mc.num_kv_heads)  # a GGUF's: its tensors' exact values
    for name in sorted(tensors):
        t = tensors[name].float()
        if t.dim() == 2:  # the matrices; the norms' weights stay as they are, in bf16
            t = t + torch.randn(t.shape, generator=gen) * (noise * float(t.std()))
        tensors[name] = t.to(dtype or torch.bfloat16).contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    for item in model_dir.iterdir():
        if item.suffix != ".safetensors" and item.is_file() and not item.name.startswith("bulkhead_"):
            shutil.copy(item, out / item.name)
    return out


def import_gguf(gguf_file: Path, out: Path) -> Path:
    """`bulkhead convert`'s import of a GGUF file into a model directory."""
    return convert_gguf(gguf_file, out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=("q4_0", "bf16"))
    ap.add_argument("out", type=Path)
    ap.add_argument("--import-to", type=Path, default=None, help="q4_0: also import the file into this directory")
    args = ap.parse_args(argv)
    if args.kind == "q4_0":
        requantize_gguf(bundled_gguf_path(), args.out)
        if args.import_to:
            import_gguf(args.out, args.import_to)
    else:
        bf16_checkpoint(args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
