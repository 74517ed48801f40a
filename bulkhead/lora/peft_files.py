"""A PEFT LoRA directory, validated as untrusted input before any weight is read.

    alpha-sql/
      adapter_config.json          # {"peft_type": "LORA", "r": 16, "lora_alpha": 32, "target_modules": [...]}
      adapter_model.safetensors    # base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight, ...

What is refused, each with the file and the reason (AdapterRefused): a
pickle (`adapter_model.bin`: loading one runs code), a file over the size
limit, a rank over the rank limit, a non-finite or non-positive
`lora_alpha`, a target module that is not one of the base model's linear
layers, PEFT features that change more than the low-rank deltas (biases,
`modules_to_save`, DoRA, per-module rank or alpha patterns), and any tensor
whose name, dtype or shape does not fit the base model. The checks read
the JSON config and the safetensors header only (its first 8 bytes give the
header's length); the values are checked for finiteness where they are
loaded (bulkhead.model.lora_weights).

The digest is SHA-256 over the weights file and the two numbers that scale
it: the same digest means the same deltas, whatever the file is called.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from bulkhead.lora import products

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PICKLE_FILE = "adapter_model.bin"
MAX_RANK = 64
MAX_BYTES = 256 << 20
# The base model's linear layers an adapter may target, and where each sits in a decoder layer.
MODULES = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
FLOAT_DTYPES = {"F32", "F16", "BF16"}
# The model runs q/k/v as one matmul and gate/up as one (bulkhead.model.lora_weights fuses deltas the same way).
FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",), "gate_up": ("gate_proj", "up_proj"),
         "down": ("down_proj",)}
# PEFT's name for each delta, with or without the adapter's own name ("default") that some versions add.
_TENSOR = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight")
# Config keys whose presence (set to something other than these values) means weights beyond LoRA deltas.
_UNSUPPORTED = {"bias": ("none", None), "modules_to_save": (None, []), "use_dora": (False, None),
                "rank_pattern": ({}, None), "alpha_pattern": ({}, None), "fan_in_fan_out": (False, None)}


class AdapterRefused(ValueError):
    """An adapter directory that will not be served; the message names the file and the reason."""


@dataclass(frozen=True)
class BaseShapes:
    """What an adapter must fit: the base model's layers and each linear's (out, in)."""
    num_layers: int
    linears: dict[str, tuple[int, int]]  # module name -> (out_features, in_features)

    @classmethod
    def of(cls, config) -> BaseShapes:
        """From a bulkhead.model.config.ModelConfig (or anything with its fields)."""
        h, q, kv, ff = config.hidden_size, config.num_heads * config.head_dim, \
            config.num_kv_heads * config.head_dim, config.intermediate_size
        return cls(config.num_layers, {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
                                       "gate_proj": (ff, h), "up_proj": (ff, h), "down_proj": (h, ff)})


@dataclass(frozen=True)
class AdapterFiles:
    """A validated adapter directory: what the workers load, and what the ticket carries."""
    path: Path
    rank: int
    scaling: float  # lora_alpha / r (or / sqrt(r) with use_rslora): the delta is scaling * B @ A
    targets: tuple[tuple[int, str], ...]  # (layer, module) pairs the file has deltas for, sorted
    tensors: dict[str, tuple[int, str, str]]  # tensor name -> (layer, module, "A" or "B")
    digest: str  # hex SHA-256 of the weights file and the scaling
    nbytes: int  # the weights file's size


def resident_bytes(files: AdapterFiles, base: BaseShapes) -> int:
    """The bytes a worker holds for the adapter once loaded on the default
    kernels: the packed copy the C delta reads, for the products this
    machine's workers take (bulkhead.lora.products.preferred), the only copy
    held there (a worker on the exact path holds fp32_bytes instead)."""
    return packed_bytes(files, base, products.preferred())


def fp32_bytes(files: AdapterFiles, base: BaseShapes) -> int:
    """The fp32 deltas a worker loads (LoraWeights.nbytes)."""
    return 4 * sum(files.rank * (in_f + out_f) for in_f, out_f in _fused_linears(files, base))


def packed_bytes(files: AdapterFiles, base: BaseShapes, kind: str = "bf16") -> int:
    """The copy the C delta reads (bulkhead.model.lora_layers.PackedAdapter)
    for products `kind`, what a worker holds where the C decode layers run
    adapter rows (the default kernels). bf16 and fp32 products: 2 bytes a
    number, an odd rank or input width padded by one where the CPU takes
    bf16 products (counted for both: the most it holds); int8: 1 byte a
    number, padded the same way, and a 4-byte scale per rank of each module."""
    even = lambda n: n + n % 2  # noqa: E731
    numbers = sum(files.rank * even(in_f) + even(files.rank) * out_f for in_f, out_f in _fused_linears(files, base))
    if kind == "int8":
        return numbers + 4 * files.rank * sum(1 for _ in _fused_linears(files, base))
    return 2 * numbers


def _fused_linears(files: AdapterFiles, base: BaseShapes):
    """(input width, output width) of each targeted module, in the fused linears' layout."""
    for layer in range(base.num_layers):
        for modules in FUSED.values():
            for m in modules:
                if (layer, m) in files.targets:
                    yield base.linears[m][1], base.linears[m][0]


def read_adapter(path: Path, base: BaseShapes, max_rank: int = MAX_RANK, max_bytes: int = MAX_BYTES,
                 data: bytes | None = None) -> AdapterFiles:
    """Validate the PEFT directory at `path` against `base`; raises AdapterRefused.
    data: the weights file as read_weights() read it (a worker, which then
    loads those very bytes: the header checked, the digest and the values
    are all of one read); None reads the header and streams the digest
    from disk (the router, which never holds the weights)."""
    path = Path(path)
    weights = path / WEIGHTS_FILE
    if not path.is_dir():
        raise AdapterRefused(f"{path}: not a directory (an adapter is a PEFT directory: {CONFIG_FILE} + {WEIGHTS_FILE})")
    if not weights.is_file():
        why = "a pickle, which is never loaded (loading one runs code): save it as safetensors" \
            if (path / PICKLE_FILE).exists() else "missing"
        raise AdapterRefused(f"{weights}: {why}")
    rank, scaling, targets = _read_config(path / CONFIG_FILE, max_rank)
    nbytes = weights.stat().st_size if data is None else len(data)
    if nbytes > max_bytes:
        raise AdapterRefused(f"{weights}: {nbytes} bytes, over the limit of {max_bytes}")
    tensors = _check_tensors(weights, _header(weights, nbytes, data), base, rank, targets)
    pairs = tuple(sorted({(layer, module) for layer, module, _ in tensors.values()}))
    digest = _digest(weights, rank, scaling) if data is None else digest_of(data, rank, scaling)
    return AdapterFiles(path, rank, scaling, pairs, tensors, digest, nbytes)


def read_weights(path: Path, max_bytes: int = MAX_BYTES) -> bytes:
    """The adapter's weights file, read once and at most max_bytes + 1 bytes
    of it (enough for read_adapter to refuse a file over the limit)."""
    with (Path(path) / WEIGHTS_FILE).open("rb") as f:
        return f.read(max_bytes + 1)


def _read_config(config_file: Path, max_rank: int) -> tuple[int, float, set[str]]:
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as e:
        raise AdapterRefused(f"{config_file}: not readable as JSON: {e}") from None
    if not isinstance(config, dict):
        raise AdapterRefused(f"{config_file}: expected a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterRefused(f"{config_file}: peft_type {config['peft_type']!r}: only LORA adapters are served")
    for key, allowed in _UNSUPPORTED.items():
        if config.get(key) not in allowed:
            raise AdapterRefused(f"{config_file}: {key}={config[key]!r} is not supported "
                                 "(only low-rank deltas on the linear layers are served)")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= max_rank:
        raise AdapterRefused(f"{config_file}: r must be a whole number from 1 to {max_rank}, got {rank!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not math.isfinite(alpha) or alpha <= 0:
        raise AdapterRefused(f"{config_file}: lora_alpha must be a finite number > 0, got {alpha!r}")
    scaling = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    return rank, float(scaling), _targets(config_file, config.get("target_modules"))


def _targets(config_file: Path, targets: object) -> set[str]:
    if isinstance(targets, str):  # PEFT reads a string as a regular expression over module names
        chosen = {m for m in MODULES if re.fullmatch(targets, m) or re.fullmatch(targets, f"{MODULES[m]}.{m}")}
        if not chosen:
            raise AdapterRefused(f"{config_file}: target_modules {targets!r} matches none of {sorted(MODULES)}")
        return chosen
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise AdapterRefused(f"{config_file}: target_modules must be a non-empty list of module names, got {targets!r}")
    unknown = sorted(set(targets) - set(MODULES))
    if unknown:
        raise AdapterRefused(f"{config_file}: target_modules {unknown} are not linear layers of the base model "
                             f"(known: {sorted(MODULES)})")
    return set(targets)


def _header(weights: Path, nbytes: int, data: bytes | None) -> dict:
    with (io.BytesIO(data) if data is not None else weights.open("rb")) as f:
        head = f.read(8)
        if len(head) < 8:
            raise AdapterRefused(f"{weights}: not a safetensors file (shorter than its 8-byte header length)")
        (length,) = struct.unpack("<Q", head)
        if length > min(nbytes - 8, 100 << 20):
            raise AdapterRefused(f"{weights}: not a safetensors file (a header of {length} bytes in a "
                                 f"file of {nbytes})")
        try:
            header = json.loads(f.read(length))
        except ValueError as e:
            raise AdapterRefused(f"{weights}: not a safetensors file (header: {e})") from None
    if not isinstance(header, dict):
        raise AdapterRefused(f"{weights}: not a safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    return header


def _check_tensors(weights: Path, header: dict, base: BaseShapes, rank: int,
                   targets: set[str]) -> dict[str, tuple[int, str, str]]:
    found: dict[str, tuple[int, str, str]] = {}
    for name, info in header.items():
        m = _TENSOR.fullmatch(name)
        if m is None or m.group(3) not in MODULES or MODULES[m.group(3)] != m.group(2):
            raise AdapterRefused(f"{weights}: tensor {name!r} is not a LoRA delta of a linear layer")
        layer, module, side = int(m.group(1)), m.group(3), m.group(4)
        if layer >= base.num_layers:
            raise AdapterRefused(f"{weights}: tensor {name!r}: layer {layer}, the base model has {base.num_layers}")
        if module not in targets:
            raise AdapterRefused(f"{weights}: tensor {name!r}: {module} is not in the config's target_modules")
        dtype = info.get("dtype") if isinstance(info, dict) else None
        if dtype not in FLOAT_DTYPES:
            raise AdapterRefused(f"{weights}: tensor {name!r}: dtype {dtype} (expected one of {sorted(FLOAT_DTYPES)})")
        out_f, in_f = base.linears[module]
        expected = [rank, in_f] if side == "A" else [out_f, rank]
        if info.get("shape") != expected:
            raise AdapterRefused(f"{weights}: tensor {name!r}: shape {info.get('shape')}, the base model's "
                                 f"{module} needs {expected} at rank {rank}")
        if (layer, module, side) in found.values():
            raise AdapterRefused(f"{weights}: tensor {name!r}: a second lora_{side} for layer {layer} {module}")
        found[name] = (layer, module, side)
    sides: dict[tuple[int, str], set[str]] = {}
    for layer, module, side in found.values():
        sides.setdefault((layer, module), set()).add(side)
    for (layer, module), have in sorted(sides.items()):
        if have != {"A", "B"}:
            raise AdapterRefused(f"{weights}: layer {layer} {module} has lora_{''.join(have)} without its pair")
    if not found:
        raise AdapterRefused(f"{weights}: no LoRA deltas in the file")
    return found


def _digest(weights: Path, rank: int, scaling: float) -> str:
    h = _digest_start(rank, scaling)
    with weights.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def digest_of(data: bytes, rank: int, scaling: float) -> str:
    """The digest of weights read into memory: what a worker checks the bytes it loads against."""
    h = _digest_start(rank, scaling)
    h.update(data)
    return h.hexdigest()


def _digest_start(rank: int, scaling: float):
    return hashlib.sha256(f"lora r={rank} scaling={scaling!r}\n".encode())
