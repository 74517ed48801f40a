"""`--role router` and `--role local`: the HTTP server over a cluster of
prefill and decode workers (local: this process spawns them and stops them)."""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from pathlib import Path

import uvicorn

from bulkhead.disagg.launch import cluster_key, spawn_workers
from bulkhead.disagg.router import DisaggBackend
from bulkhead.disagg.signing import Signer
from bulkhead.disagg.worker_watch import WorkerWatch
from bulkhead.launch.engine_flags import engine_config
from bulkhead.model.config import load_sampling_defaults
from bulkhead.model.gguf_import import cache_root
from bulkhead.model.tokenizer import Tokenizer
from bulkhead.seams import Seams

log = logging.getLogger("bulkhead")


def router_backend(args, model_dir: Path, model_id: str, auth: str, seams: Seams):
    """The router's backend, and (--role local) the worker processes it spawned."""
    control = args.control_address or f"tcp://127.0.0.1:{args.port + 1}"
    key_file = args.cluster_key_file or cache_root() / "cluster.key"
    args.cluster_key_file = key_file
    backend = DisaggBackend(Tokenizer(model_dir), model_id, Signer(cluster_key(args), "router"), control, auth,
                            request_timeout_s=args.request_timeout)
    backend.sampling_defaults = load_sampling_defaults(model_dir)
    workers = []
    if args.role == "local":
        engines = {role: engine_config(args, model_dir, model_id, role) for role in ("prefill", "decode")}
        workers = spawn_workers(args, control, key_file, engines, seams)
    return backend, workers


def serve_router(backend: DisaggBackend, workers: list[subprocess.Popen], server: uvicorn.Server,
                 transfer: str) -> int:
    """Serve until SIGTERM or SIGINT, then stop the workers this process spawned."""
    backend.start()
    if workers and not wait_for_workers(backend, workers):
        backend.stop()
        return 1
    watch = WorkerWatch(workers, transfer).start() if workers else None
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
        stop_workers(workers)
        backend.stop()
    return 0


def stop_workers(workers: list[subprocess.Popen]) -> None:
    """Workers drain on SIGTERM: while the router still listens they are
    told at once that nothing more is coming, and exit."""
    for proc in workers:
        proc.terminate()
    for proc in workers:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log.error("worker pid %d did not exit: killing it", proc.pid)
            proc.kill()


def wait_for_workers(backend: DisaggBackend, workers: list[subprocess.Popen], timeout: float = 900.0,
                     progress_every: float = 30.0) -> bool:
    """Local mode: serve only once every worker registered; a worker that
    exits (a failed capacity gate, say) stops the launch. A first start lays
    the weights out (a ~1B checkpoint: 245 s on a loaded 2-core machine), so
    the wait is long and says every progress_every seconds who it waits for."""
    start = time.monotonic()
    next_progress = start + progress_every
    while time.monotonic() < start + timeout:
        failed = [p for p in workers if p.poll() is not None]
        if failed:
            log.error("a worker exited with status %d during start-up; stopping", failed[0].returncode)
            for p in workers:
                p.terminate()
            return False
        if len(backend.workers) >= len(workers):
            return True
        if time.monotonic() >= next_progress:
            next_progress += progress_every
            log.info("%d of %d workers registered after %.0fs (a first start lays the weights out)",
                     len(backend.workers), len(workers), time.monotonic() - start)
        time.sleep(0.1)
    log.error("workers did not register within %.0fs", timeout)
    return False
