"""The format each weight tensor of a model directory is stored in, as the
checkpoint stored it: a safetensors file's dtype ("BF16", "F16", "F32"), or,
for a directory imported from GGUF (bulkhead.model.gguf_import), the GGUF
tensor type it was dequantized from ("Q4_0", "Q4_1", "Q8_0", "F32", ...),
recorded at import in FORMATS_FILE.

Why: the import dequantizes every tensor to fp32, and the fp32 values alone
do not say what the file held; the kernel choice (linear_kernel.choose)
reads the linear layers' stored format from here. A directory imported
before this record existed has none, and its choice falls back to reading
the values (linear_kernel.q4_usable), as it did.
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
