"""The systems bench/peers.py compares, and how each one is started.

A server system is a context manager that starts its server, waits until it
answers, and yields a `Running` (where to send requests, which process tree
to measure); it stops the server on exit. An optional peer that is not
installed says why in `unavailable()`, and the harness prints that line.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.workload import Endpoint
from tests.server_process import ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


@dataclass(frozen=True)
class Running:
    endpoint: Endpoint
    pid: int  # root of the process tree whose memory is measured
    info: dict  # what the server says about itself (bulkhead: /server_info)


@dataclass(frozen=True)
class Settings:
    """What every system gets alike."""

    model_dir: Path  # Hugging Face directory of the model (bulkhead, transformers, vLLM)
    gguf: Path  # the same model as GGUF (llama-cpp-python)
    kv_memory_gib: float  # KV cache budget, for the servers that size one up front
    context_length: int
    logs: Path


# -- bulkhead -------------------------------------------------------------------

BULKHEAD_FLAGS = {
    "bulkhead": ["--role", "colocated"],
    # The exact fp32 model: oneDNN fp32 linear layers for decode too (the
    # default takes int4 ones for the bundled 4-bit SmolLM2).
    "bulkhead-fp32": ["--role", "colocated", "--linear-kernel", "onednn"],
    "bulkhead-disagg": ["--role", "local", "--prefill", "1", "--decode", "1"],
    # Benchmark only: the guard cost is this system against "bulkhead".
    "bulkhead-no-guards": ["--role", "colocated", "--unsafe-no-guards"],
}


@contextlib.contextmanager
def bulkhead(name: str, s: Settings, extra_flags: list[str]):
    flags = [*BULKHEAD_FLAGS[name], "--kv-memory", f"{int(s.kv_memory_gib * 2**30)}",
             "--context-length", str(s.context_length), "--model", str(s.model_dir),
             "--model-id", "bench", *extra_flags]
    server = ServerProcess(flags, s.logs / f"peers-{name}.log").wait_ready(timeout=600)
    try:
        info = server.info()
        want = "off" if name == "bulkhead-no-guards" else "on"
        if info.get("guards") != want:  # measure what the table claims, or nothing
            raise RuntimeError(f"{name}: /server_info says guards={info.get('guards')!r}, expected {want!r}")
        yield Running(Endpoint(server.url, "bench"), server.proc.pid, info)
    finally:
        server.stop()


# -- peers in their own virtual environments ------------------------------------------


def venv_python(given: str | None, default: str) -> Path:
    return Path(given) if given else BENCH / default / "bin" / "python"


def import_problem(python: Path, module: str, setup: str) -> str | None:
    """Why `module` cannot be used from `python`, or None when it can."""
    if not python.exists():
        return f"no {python.relative_to(ROOT) if python.is_relative_to(ROOT) else python} (run {setup})"
    done = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return f"`import {module}` fails in {python}: {last}"
    return None


@contextlib.contextmanager
def child_server(name: str, cmd: list[str], env: dict, url: str, s: Settings, timeout: float = 600):
    log_path = s.logs / f"peers-{name}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}; see {log_path}:\n"
                                       + log_path.read_text()[-3000:])
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} not ready after {timeout:.0f}s; see {log_path}")
                time.sleep(1)
            yield proc
        finally:
            # Its whole session: vLLM's engine core is a child process.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()


VLLM_DTYPES = {"vllm": "float32", "vllm-bf16": "bfloat16"}


@contextlib.contextmanager
def vllm(name: str, python: Path, s: Settings, extra_args: list[str]):
    """vLLM's CPU build (bench/setup_vllm.sh). It binds beyond loopback: the
    harness runs it only inside a private network namespace (peers.py).
    "vllm" runs fp32 as bulkhead-fp32 and transformers do; "vllm-bf16" in
    bf16, its CPU default where the CPU has AVX-512 BF16, as this one does."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(s.model_dir),
           "--served-model-name", "bench", "--host", "127.0.0.1", "--port", str(port),
           "--dtype", VLLM_DTYPES[name], "--max-model-len", str(s.context_length), "--seed", "0", *extra_args]
    # The same KV budget as bulkhead's.
    env = {"VLLM_CPU_KVCACHE_SPACE": str(max(1, round(s.kv_memory_gib)))}
    # Its first start compiles kernels: minutes on two cores, many more on busy ones.
    with child_server(name, cmd, env, url, s, timeout=1800) as proc:
        yield Running(Endpoint(url, "bench"), proc.pid, {})


@contextlib.contextmanager
def llama_cpp(python: Path, s: Settings):
    """llama-cpp-python's OpenAI server on the same model's GGUF (bench/setup_llama.sh)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(python), "-m", "llama_cpp.server", "--model", str(s.gguf), "--model_alias", "bench",
           "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(s.context_length),
           "--n_threads", str(os.cpu_count()), "--n_threads_batch", str(os.cpu_count())]
    # Text prompts only; min_tokens stands in for ignore_eos, and its default
    # repeat penalty (1.1) would make it compute something else than greedy.
    endpoint = Endpoint(url, "bench", text_prompts=True, exact_length="min_tokens",
                        extra=(("repeat_penalty", 1.0),))
    with child_server("llama-cpp", cmd, {}, url, s) as proc:
        yield Running(endpoint, proc.pid, {})


def hf_static_cmd(s: Settings) -> list[str]:
    return [sys.executable, str(BENCH / "hf_static.py"), str(s.model_dir)]
