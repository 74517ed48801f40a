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

from bulkhead.engine.engine_config import GUARDS_OFF_WARNING, EngineConfig
from bulkhead.kv.layout import parse_memory
from bulkhead.lora.peft_files import BaseShapes
from bulkhead.lora.registry import AdapterRegistry
from bulkhead.model.config import load_model_config
from bulkhead.model.gguf_import import DEFAULT_MODEL_ID, default_model_dir
from bulkhead.server.app import ServerState, create_app
from bulkhead.server.auth import KeyStore
from bulkhead.server.http_server import BoundServer
from bulkhead.seams import PRODUCTION, Seams

log = logging.getLogger("bulkhead")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _adapters(keys: KeyStore | None, model_dir: Path) -> AdapterRegistry | None:
    """The tenants' LoRA adapters, following keys.toml (none without keys: adapters belong to tenants)."""
    if keys is None:
        return None
    registry = AdapterRegistry(BaseShapes.of(load_model_config(model_dir))).follow(keys)
    if registry.loaded():
        log.info("LoRA adapters: %d (%s)", len(registry.loaded()),
                 ", ".join(sorted(f"{a.tenant}/{a.name}" for a in registry.loaded())))
    return registry


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
        slice_tokens=0 if args.no_interjection else EngineConfig.slice_tokens,
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
        keys = KeyStore.from_sources(args.api_keys, model_id)
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
    state = ServerState(backend, keys, seams, default_max_tokens=args.default_max_tokens,
                        adapters=_adapters(keys, model_dir))
    app = create_app(state)
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
    state.stopping = lambda: server.should_exit  # SIGTERM: /ready is 503 while in-flight requests finish
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
