"""The format each weight tensor of a model directory is stored in, as the
checkpoint stored it: a safetensors file's dtype ("BF16", "F16", "F32"), a
GGUF file's tensor type ("Q4_0", "Q4_1", "Q8_0", "F32", ...) for a directory
whose weights stay in the GGUF (bulkhead.model.gguf_import.GGUF_POINTER),
or, for a directory `bulkhead convert` dequantized from GGUF, the type each
tensor was dequantized from, recorded at import in FORMATS_FILE.

Why: the kernel choice (linear_kernel.choose) reads the linear layers'
stored format from here, and /server_info names each tensor group's
(`describe`); a dequantized import's fp32 values alone do not say what the
file held. A directory converted before FORMATS_FILE existed has none, and
its choice falls back to reading the values (linear_kernel.q4_usable).
"""

from __future__ import annotations

import json
from pathlib import Path

FORMATS_FILE = "bulkhead_formats.json"  # {Hugging Face tensor name: GGUF tensor type name}
# The tensors the linear kernels take (LayerWeights' qkv, o, gate_up and down), by name suffix.
LINEAR_SUFFIXES = tuple(f"{part}.weight" for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                      "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                      "mlp.down_proj"))


def record_gguf_formats(gguf_file: Path, model_dir: Path, names: list[str]) -> dict[str, str]:
    """Write FORMATS_FILE into `model_dir`: for each Hugging Face tensor name
    in `names` (what the import saved), the type of the GGUF tensor it came
    from; a name with no GGUF counterpart is left out. Returns the record."""
    import gguf

    reader = gguf.GGUFReader(gguf_file)
    field = reader.fields["general.architecture"]
    arch_name = bytes(field.parts[field.data[0]]).decode()
    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch_name)
    blocks = 1 + max((int(n.split(".")[2]) for n in names if n.startswith("model.layers.")), default=0)
    name_map = gguf.get_tensor_name_map(arch, blocks)
    stored = {t.name: t.tensor_type.name for t in reader.tensors}
    record = {}
    for name in names:
        gguf_name = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is not None and gguf_name in stored:
            record[name] = stored[gguf_name]
        elif name == "lm_head.weight" and "output.weight" not in stored and "token_embd.weight" in stored:
            record[name] = stored["token_embd.weight"]  # tied: the file holds the embedding once
    (Path(model_dir) / FORMATS_FILE).write_text(json.dumps(record, indent=1, sort_keys=True))
    return record


def stored_formats(model_dir: Path) -> dict[str, str]:
    """{tensor name: the format the checkpoint stored it in} for a model directory."""
    model_dir = Path(model_dir)
    from bulkhead.model.gguf_import import gguf_pointer

    if (pointer := gguf_pointer(model_dir)) is not None:  # weights read from the GGUF as stored: its own types
        from bulkhead.model.gguf_weights import GGUFFile

        return GGUFFile(pointer["gguf"], pointer.get("table")).formats()
    record = model_dir / FORMATS_FILE
    if record.exists():
        return json.loads(record.read_text())
    from safetensors import safe_open

    formats = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            formats.update({name: st.get_slice(name).get_dtype() for name in st.keys()})
    return formats


def linear_format(model_dir: Path) -> str | None:
    """The one format every linear layer weight is stored in ("Q4_1", "BF16",
    ...), or None where they differ or none is known."""
    found = {fmt for name, fmt in stored_formats(model_dir).items() if name.endswith(LINEAR_SUFFIXES)}
    return found.pop() if len(found) == 1 else None


# /server_info's tensor groups: ModelWeights' fused tensors and the Hugging Face names each holds, by suffix.
GROUPS = {"embed": ("model.embed_tokens.weight",), "qkv": LINEAR_SUFFIXES[:3], "o": LINEAR_SUFFIXES[3:4],
          "gate_up": LINEAR_SUFFIXES[4:6], "down": LINEAR_SUFFIXES[6:], "lm_head": ("lm_head.weight",),
          "norms": ("norm.weight", "layernorm.weight")}


def describe(model_dir: Path, linear_kernel: str, lm_head_kernel: str) -> dict[str, dict]:
    """{group: {"stored": its format(s), "kernel": what runs it}} for
    /server_info. A GGUF type with no decoder (bulkhead.model.gguf_codes)
    says so: its tensors were dequantized to fp32 for the float kernels."""
    from bulkhead.model.gguf_codes import fallback_types
    from bulkhead.model.gguf_import import gguf_of

    from bulkhead.model.config import load_model_config

    formats = stored_formats(model_dir)
    tied = load_model_config(model_dir).tie_word_embeddings or "lm_head.weight" not in formats  # loader's rule
    kernels = {"embed": "8-bit rows, the lm_head's codes" if lm_head_kernel == "q8-i16in" and tied else "row lookup",
               "lm_head": lm_head_kernel, "norms": "fp32"}
    fallback = set(fallback_types(formats.values())) if gguf_of(model_dir) is not None else set()
    out = {}
    for group, suffixes in GROUPS.items():
        found = sorted({fmt for name, fmt in formats.items() if name.endswith(suffixes)})
        if group == "lm_head" and not found:
            found = sorted({formats.get("model.embed_tokens.weight", "?")})
        kernel = kernels.get(group, linear_kernel)
        if linear_kernel == "gguf-i16in" and group in ("qkv", "o", "gate_up", "down"):
            kernel = per_group_kernels(formats, group)
        out[group] = {"stored": "+".join(found), "kernel": kernel}
        if fallback.intersection(found):
            out[group]["dequantized_to_fp32"] = sorted(fallback.intersection(found))  # no decoder for these
    return out


def per_group_kernels(formats: dict[str, str], group: str) -> str:
    """The decode micro-kernels that run a fused group under gguf-i16in
    (each layer's by its parts' stored types: format_linear.kernel_of_types),
    "+"-joined where layers differ (a Q4_K_M file's down: q4-i16in in some
    layers, q8a-i16in over Q6_K in others)."""
    from bulkhead.model.format_linear import kernel_of_types
    from bulkhead.model.gguf_weights import FUSED

    layers = sorted({int(name.split(".")[2]) for name in formats if name.startswith("model.layers.")})
    found = {kernel_of_types([formats.get(f"model.layers.{i}.{part}.weight") for part in FUSED[group]])
             for i in layers}
    return "+".join(sorted(k or "fp32" for k in found))
