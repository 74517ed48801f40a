"""`bulkhead serve`: build the engine, check the edges, start the HTTP server."""

from __future__ import annotations

import argparse
import ipaddress
import signal
import subprocess
import threading

import uvicorn
import logging
from pathlib import Path

from bulkhead.disagg.launch import add_disagg_arguments
from bulkhead.engine.engine_config import GUARDS_OFF_WARNING, EngineConfig
from bulkhead.kv.layout import parse_memory
from bulkhead.model import kernel_names
from bulkhead.model.gguf_import import DEFAULT_MODEL_ID, default_model_dir
from bulkhead.server.app import ServerState, create_app
from bulkhead.server.auth import KeyStore
from bulkhead.server.http_server import BoundServer
from bulkhead.server.params import DEFAULT_MAX_TOKENS
from bulkhead.seams import PRODUCTION, Seams

log = logging.getLogger("bulkhead")


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, default=None,
                   help="Hugging Face safetensors directory (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--model-id", default=None, help="name served in /v1/models (default: the directory name)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000,
                   help="HTTP port (default %(default)s); --role local's router also takes the next port for its "
                        "workers' control socket unless --control-address says otherwise")
    p.add_argument("--kv-memory", default="2GiB",
                   help="KV pool size: bytes (2GiB, 512MB) or a fraction of available RAM (0.25). Default 2GiB")
    p.add_argument("--page-size", type=int, default=16, help="tokens per KV page (default 16)")
    p.add_argument("--context-length", type=int, default=None,
                   help="advertised context length, prompt + max_tokens (default: the model's)")
    p.add_argument("--clamp-context-length", action="store_true",
                   help="if the pool cannot hold the context, advertise what it holds instead of refusing to start")
    p.add_argument("--scrub-mode", choices=("zero", "poison"), default="zero",
                   help="how freed KV pages are scrubbed; poison (NaN) makes stale reads visible in tests")
    p.add_argument("--api-keys", type=Path, default=None,
                   help="TOML file with a [keys] table of key = \"tenant\" (or set BULKHEAD_API_KEYS) and an "
                        "[operators] table of key = \"name\" for /metrics and /server_info (or set "
                        "BULKHEAD_OPERATOR_KEYS)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="dtype of the weights as loaded and the activations (default %(default)s; the KV cache's is "
                        "--kv-dtype; "
                        "--linear-kernel may run matmuls in int4 or bf16 over fp32 weights, /server_info "
                        "matmul_precision says which)")
    p.add_argument("--kv-dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                   help="element type of the KV cache (default %(default)s = bfloat16: half the bytes decode "
                        "attention reads and twice the tokens a KV budget holds; attention still computes in fp32 "
                        "on the widened values; docs/performance.md has its measured agreement with the exact "
                        "model); float32 with --linear-kernel onednn is the exact fp32 model")
    p.add_argument("--default-max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help="max_tokens of a request that names none (default %(default)s; 0 = the rest of the context, "
                        "as vLLM does, which lets a looping model run for minutes)")
    p.add_argument("--max-running", type=int, default=32, help="most requests decoding at once")
    p.add_argument("--prefill-chunk", type=int, default=512, help="prompt tokens per prefill pass")
    p.add_argument("--step-tokens", type=int, default=0,
                   help="colocated: tokens one step carries, decode rows plus prefill chunks (default: one chunk "
                        "beside a full decode batch)")
    p.add_argument("--fairness", choices=("vtc", "fcfs"), default="vtc",
                   help="colocated: which prompt is prefilled next; vtc = the least-served tenant's (default), "
                        "fcfs = first come, first served (to measure what fairness costs)")
    p.add_argument("--no-interjection", action="store_true",
                   help="a less-served tenant's prompt and decode rows wait for a long prefill pass to end instead "
                        "of running between its layers (to measure what interjection does)")
    p.add_argument("--no-kv-quotas", action="store_true",
                   help="colocated: under page pressure preempt the newest request, whoever's it is, instead of "
                        "the tenant furthest over its KV share")
    p.add_argument("--decode-tile", type=int, default=16,
                   help="batch invariance: decode batches are padded to a row multiple measured at start-up to "
                        "be batch-invariant on this CPU, else split into tiles of this many rows (0 = off)")
    p.add_argument("--no-safe-mode", action="store_true", help="skip the per-step page ownership check")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's choice; with --role local, every core, the workers taking "
                        "turns, or with --core-sharing split the cores split among them)")
    p.add_argument("--linear-kernel", choices=kernel_names.KERNELS, default="auto",
                   help="linear layers: auto = q4-i16in for weights exactly on a 4-bit grid (the bundled Q4_1 "
                        "SmolLM2) on a CPU with AVX-512 BF16 and VNNI: "
                        f"{kernel_names.MATMUL_PRECISION['q4-i16in']}; with BF16 alone q4-bf16in: "
                        f"{kernel_names.MATMUL_PRECISION['q4-bf16in']}; "
                        f"without AVX-512 BF16 q4: {kernel_names.MATMUL_PRECISION['q4']}, the exact model's numbers; else "
                        "int4 for "
                        "weights near such a grid, else oneDNN fp32 over weights laid out at load where this torch "
                        "build has it, else aten's F.linear (both exact fp32); onednn-bf16 = bf16 matmuls; int4 = "
                        f"{kernel_names.MATMUL_PRECISION['int4']}; q4-bf16in-all (opt-in) = "
                        f"{kernel_names.MATMUL_PRECISION['q4-bf16in-all']}. "
                        f"Under q4-i16in an lm_head exactly on an 8-bit grid (the bundled one) takes "
                        f"{kernel_names.HEAD_PRECISION['q8-i16in']}; otherwise with q4, q4-bf16in(-all), q4-i16in, "
                        "int4 or onednn-bf16 the lm_head takes "
                        f"{kernel_names.HEAD_PRECISION['bf16w']}; attention computes in fp32 (the KV cache's dtype is --kv-dtype) "
                        "(docs/performance.md)")
    p.add_argument("--decode-attention", choices=kernel_names.DECODE_ATTENTION, default="auto",
                   help="decode attention: c = a C kernel reading the paged pool in place (compiled once per "
                        "machine), torch = gather pages and SDPA per request; auto = c where it builds")
    p.add_argument("--prefill-attention", choices=kernel_names.PREFILL_ATTENTION, default="auto",
                   help="a prompt's attention: bf16 = a C kernel on bf16 dot products (q, K, V and the softmax's "
                        "probabilities rounded to bf16; scores, sums and outputs fp32), torch = fp32 SDPA; auto = "
                        "bf16 where the linear kernel is q4-bf16in, q4-i16in or q4-bf16in-all (prompts' inputs already "
                        "rounded "
                        "to bf16) and "
                        "the CPU has AVX-512 BF16, else torch")
    p.add_argument("--prefill-glue", choices=kernel_names.PREFILL_GLUE, default="auto",
                   help="the ops around a prompt pass's matmuls and attention (norms, rotary, SiLU, residual adds): "
                        "c = one C call per op over every row, torch = torch ops; auto = c where it builds and the "
                        "linear kernel is not an exact one (onednn, aten)")
    p.add_argument("--decode-glue", choices=kernel_names.DECODE_GLUE, default="auto",
                   help="the ops around a decode step's matmuls and attention (norms, rotary, KV write, SiLU): "
                        "c = every layer in one C call, where the linear kernel is q4, q4-bf16in, q4-i16in or "
                        "q4-bf16in-all "
                        "and decode attention c; "
                        "torch = one torch op at a time; auto = c where it can run")
    p.add_argument("--prefix-cache", choices=("auto", "on", "off"), default="auto",
                   help="tenant-scoped prefix cache; auto = on for prefill workers, off colocated (where it would "
                        "make greedy output depend on which request filled the cache)")
    p.add_argument("--request-timeout", type=float, default=600.0,
                   help="router: seconds before an unanswered request ends with a typed 504 (default 600)")
    p.add_argument("--log-level", default="info", type=str.lower, choices=("debug", "info", "warning", "error", "critical"),
                   help="log level of bulkhead and uvicorn (default %(default)s)")
    p.add_argument("--unsafe-no-guards", action="store_true",
                   help="BENCHMARK ONLY, turns off tenant isolation: no scrub on free, no transfer digests, no "
                        "per-step ownership or finite-logit checks; refused with API keys")
    add_disagg_arguments(p)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _engine_config(args, model_dir: Path, model_id: str, role: str | None = None) -> EngineConfig:
    """The engine of `role` (default args.role); --role local's workers each
    get their role's pool (--prefill-kv-memory, --decode-kv-memory)."""
    role = role or args.role
    kv_memory = (getattr(args, f"{role}_kv_memory", None) if role in ("prefill", "decode") else None) or args.kv_memory
    return EngineConfig(
        model_dir=Path(model_dir), model_id=model_id, kv_memory_bytes=parse_memory(kv_memory),
        page_size=args.page_size, context_length=args.context_length,
        clamp_context_length=args.clamp_context_length, scrub_mode=args.scrub_mode, dtype=args.dtype,
        max_running=args.max_running, prefill_chunk=args.prefill_chunk, decode_tile=args.decode_tile,
        safe_mode=not args.no_safe_mode, threads=args.threads, linear_kernel=args.linear_kernel,
        decode_attention=args.decode_attention, decode_glue=args.decode_glue,
        prefill_attention=args.prefill_attention, prefill_glue=args.prefill_glue,
        guards=not args.unsafe_no_guards, kv_dtype=args.kv_dtype,
        step_tokens=args.step_tokens, fair=args.fairness == "vtc", kv_quotas=not args.no_kv_quotas,
        interject=not args.no_interjection,
        prefix_cache=args.prefix_cache == "on" or (args.prefix_cache == "auto" and role == "prefill"),
    )


def serve(args: argparse.Namespace, seams: Seams = PRODUCTION) -> int:
    """Start the role args.role asks for. seams: components a test harness
    swaps in (bulkhead/seams.py); production passes none."""
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    model_dir = args.model or default_model_dir()
    model_id = args.model_id or (DEFAULT_MODEL_ID if args.model is None else Path(model_dir).name)
    if args.role in ("prefill", "decode"):
        from bulkhead.disagg.launch import serve_worker, worker_config_from_args
        from bulkhead.disagg.worker_config import WorkerConfig
        from bulkhead.lineage.writer import LineageLogError

        try:
            config = (WorkerConfig.from_json(args.worker_config) if args.worker_config
                      else worker_config_from_args(args, _engine_config(args, model_dir, model_id)))
        except ValueError as e:
            log.error("%s", e)
            return 2
        logging.getLogger().setLevel(config.log_level.upper())
        try:
            return serve_worker(config, seams)
        except LineageLogError as e:
            log.error("refusing to start: %s", e)
            return 2
    if (problem := _check_lineage_flags(args)) is not None:
        log.error("refusing to start: %s", problem)
        return 2
    try:
        keys = KeyStore.from_sources(args.api_keys)
    except (OSError, ValueError) as e:  # a mistake in keys.toml names its line: refuse to start
        log.error("refusing to start: %s", e)
        return 2
    if keys is None and not _is_loopback(args.host):
        log.error("refusing to bind %s without API keys: pass --api-keys or bind 127.0.0.1", args.host)
        return 2
    if keys is not None and args.unsafe_no_guards:
        log.error("refusing --unsafe-no-guards with API keys: without its guards one tenant's KV can reach another's")
        return 2
    if args.unsafe_no_guards:
        log.warning(GUARDS_OFF_WARNING)
    auth = "api_keys" if keys else "single_tenant_loopback"
    workers = []
    if args.role == "colocated":
        # torch and the engine load here, in a process that holds one: a router never imports them.
        from bulkhead.engine.builder import build_engine
        from bulkhead.lineage.writer import LineageLogError, open_lineage
        from bulkhead.server.local_backend import LocalBackend

        try:
            lineage = open_lineage(args.lineage_log, args.lineage_key, args.lineage_max_bytes, "colocated")
        except LineageLogError as e:
            log.error("refusing to start: %s", e)
            return 2
        built = build_engine(_engine_config(args, model_dir, model_id), seams=seams, lineage=lineage)
        backend = LocalBackend(built, model_id, auth)
    else:
        backend, workers = _router_backend(args, model_dir, model_id, auth, seams)
    app = create_app(ServerState(backend, keys, seams, default_max_tokens=args.default_max_tokens))
    if keys is None:
        log.warning("no API keys: serving one tenant 'default' on loopback only")
    else:
        log.info("API keys loaded for %d tenants (%d in the tenant table), %d operator keys", len(keys.tenants),
                 len(keys.policies), len(keys.operators))
        if not keys.operators:
            log.warning("no operator keys: /metrics and /server_info refuse every request; add an [operators] "
                        "table to the keys file or set BULKHEAD_OPERATOR_KEYS")
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    server = BoundServer(config, lambda: log.info("serving %s (%s) on http://%s:%d/v1", model_id, args.role,
                                                  args.host, args.port))
    if args.role == "colocated":
        try:
            return _serve_colocated(backend, server)
        finally:
            backend.built.engine.lineage.close()
    backend.start()
    if workers and not _wait_for_workers(backend, workers):
        backend.stop()
        return 1
    from bulkhead.disagg.worker_watch import WorkerWatch

    watch = WorkerWatch(workers, args.transfer).start() if workers else None
    # uvicorn handles SIGTERM/SIGINT itself (stop accepting, let in-flight
    # requests finish) and afterwards raises the signal again into whatever
    # handler was there before; the default one would kill this process
    # before it stops its workers below, so a no-op is there instead.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if watch is not None:
            watch.stop()  # the workers' exits below are the expected ones
        # Workers drain on SIGTERM: while the router still listens they are
        # told at once that nothing more is coming, and exit.
        for proc in workers:
            proc.terminate()
        for proc in workers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log.error("worker pid %d did not exit: killing it", proc.pid)
                proc.kill()
        backend.stop()
    return 0


def _check_lineage_flags(args) -> str | None:
    """The lineage key, made once here before any worker starts (so two
    workers never race to create it); it must be a key of its own."""
    if args.lineage_log is None:
        return None
    if args.lineage_key is None:
        return "--lineage-log needs --lineage-key FILE (hex; created, mode 0600, if missing)"
    from bulkhead.lineage.chain import LineageKeyError, load_key

    try:
        key = load_key(args.lineage_key, create=True)
    except (OSError, LineageKeyError) as e:
        return str(e)
    if args.cluster_key_file is not None and Path(args.cluster_key_file).exists() and \
            Path(args.cluster_key_file).resolve() == Path(args.lineage_key).resolve():
        return "--lineage-key must be a key of its own, not the cluster key"
    del key
    if args.role == "router":
        log.warning("--lineage-log on a router alone records nothing: it holds no KV pages (pass it to the workers)")
    return None


def _serve_colocated(backend, server: uvicorn.Server) -> int:
    """The HTTP server on a thread, the engine on this (the main) thread,
    where torch's parallel ops run fastest (Engine.run_forever). SIGTERM and
    SIGINT stop both; so does the HTTP server ending on its own (a port in use)."""
    engine = backend.built.engine

    def http() -> None:
        try:
            server.run()  # on a thread, uvicorn installs no signal handlers
        finally:
            engine.stop()

    def shutdown(*_) -> None:
        server.should_exit = True  # uvicorn drains its connections, then http() stops the engine

    previous = {sig: signal.signal(sig, shutdown) for sig in (signal.SIGTERM, signal.SIGINT)}
    thread = threading.Thread(target=http, name="bulkhead-http")
    thread.start()
    try:
        engine.run_forever()
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if server.started else 1


def _wait_for_workers(backend, workers, timeout: float = 300.0) -> bool:
    """Local mode: start serving only once every worker registered; a worker
    that exits (a failed capacity gate, say) stops the launch."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        failed = [p for p in workers if p.poll() is not None]
        if failed:
            log.error("a worker exited with status %d during start-up; stopping", failed[0].returncode)
            for p in workers:
                p.terminate()
            return False
        if len(backend.workers) >= len(workers):
            return True
        time.sleep(0.1)
    log.error("workers did not register within %.0fs", timeout)
    return False


def _router_backend(args, model_dir: Path, model_id: str, auth: str, seams: Seams):
    from bulkhead.disagg.signing import Signer
    from bulkhead.disagg.launch import cluster_key, spawn_workers
    from bulkhead.disagg.router import DisaggBackend
    from bulkhead.model.gguf_import import cache_root
    from bulkhead.model.config import load_sampling_defaults
    from bulkhead.model.tokenizer import Tokenizer

    control = args.control_address or f"tcp://127.0.0.1:{args.port + 1}"
    key_file = args.cluster_key_file or cache_root() / "cluster.key"
    args.cluster_key_file = key_file
    backend = DisaggBackend(Tokenizer(model_dir), model_id, Signer(cluster_key(args), "router"), control, auth,
                            request_timeout_s=args.request_timeout)
    backend.sampling_defaults = load_sampling_defaults(model_dir)
    workers = []
    if args.role == "local":
        engines = {role: _engine_config(args, model_dir, model_id, role) for role in ("prefill", "decode")}
        workers = spawn_workers(args, control, key_file, engines, seams)
    return backend, workers
