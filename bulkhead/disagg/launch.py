"""Start the disaggregated roles: router, prefill worker, decode worker, or all
of them on this machine (`--role local`, the default of `bulkhead serve`)."""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

from bulkhead.disagg.control import Signer, load_or_create_key
from bulkhead.engine.builder import build_engine
from bulkhead.model.gguf_import import cache_root

log = logging.getLogger("bulkhead")

# Flags every worker shares with the launcher (value-taking, then switches).
_ENGINE_VALUE_FLAGS = ("model", "model_id", "page_size", "context_length", "scrub_mode", "dtype",
                       "max_running", "prefill_chunk", "decode_tile", "threads", "linear_kernel", "decode_attention",
                       "log_level", "transfer", "prefix_cache")
_ENGINE_SWITCHES = ("clamp_context_length", "no_safe_mode", "unsafe_no_guards")


def add_disagg_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--role", choices=("local", "colocated", "router", "prefill", "decode"), default="local",
                   help="local (default): router + prefill + decode processes on this machine; colocated: one "
                        "process does both; router/prefill/decode: one part, for multi-host deployments")
    p.add_argument("--prefill", type=int, default=1, help="prefill workers to start with --role local")
    p.add_argument("--decode", type=int, default=1, help="decode workers to start with --role local")
    p.add_argument("--prefill-kv-memory", default=None, help="KV pool of prefill workers (default --kv-memory)")
    p.add_argument("--decode-kv-memory", default=None, help="KV pool of decode workers (default --kv-memory)")
    p.add_argument("--control-address", default=None,
                   help="router: ZeroMQ address to bind for workers (default tcp://127.0.0.1:<port+1>)")
    p.add_argument("--router", default=None, help="worker: the router's control address")
    p.add_argument("--worker-name", default=None, help="worker: unique name (default role-pid)")
    p.add_argument("--cluster-key-file", type=Path, default=None,
                   help="hex HMAC key shared by router and workers (default: generated under ~/.cache/bulkhead)")
    p.add_argument("--transfer", choices=("shm", "tcp", "mooncake"), default="shm",
                   help="KV transfer backend a decode worker exposes (default shm: same host)")
    p.add_argument("--drain-lease", type=float, default=30.0,
                   help="decode: seconds an unacknowledged remote writer may still write a failed request's pages")


def cluster_key(args) -> bytes:
    return load_or_create_key(args.cluster_key_file or cache_root() / "cluster.key")


def serve_worker(args, engine_config, role: str) -> int:
    from bulkhead.disagg.decode_worker import DecodeWorker
    from bulkhead.disagg.prefill_worker import PrefillWorker

    if not args.router:
        log.error("--role %s needs --router tcp://HOST:PORT", role)
        return 2
    signer = Signer(cluster_key(args), args.worker_name or f"{role}-{os.getpid()}")
    if role == "decode":
        from bulkhead.disagg.transfer import make_target

        holder = {}
        if args.transfer == "shm":
            from bulkhead.disagg.transfer.shm import sweep_stale_files

            for path in sweep_stale_files():  # pools of decode workers that were killed
                log.info("removed stale KV pool file %s", path)

        def pool_factory(layout, num_pages, scrub_mode):
            holder["target"] = make_target(args.transfer, layout, num_pages, scrub_mode)
            return holder["target"].pool

        built = build_engine(engine_config, pool_factory=pool_factory)
        worker = DecodeWorker(built, engine_config.model_id, signer, args.router, target=holder["target"],
                              drain_lease_s=args.drain_lease)
    else:
        built = build_engine(engine_config, prefill_only=True)
        worker = PrefillWorker(built, engine_config.model_id, signer, args.router)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())
    try:
        worker.run()
    finally:
        if role == "decode":
            worker.target.close()
    return 0


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: no orphaned workers


def worker_threads(args) -> int:
    """Torch threads per local worker: --threads, else this machine's cores
    split among the workers. Two workers with two threads each on two cores
    halve each other whenever a prefill and a decode step overlap, and each
    pays for the other's spinning OpenMP workers: at 16 clients, 1 thread
    each served 105.9 tok/s against 76.8 with 2 (same run; 31.1 vs 31.0 at 1)."""
    if args.threads:
        return args.threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, args.prefill + args.decode))


def spawn_workers(args, control_address: str, key_file: Path) -> list[subprocess.Popen]:
    procs = []
    threads = worker_threads(args)
    for role, count in (("prefill", args.prefill), ("decode", args.decode)):
        for i in range(count):
            cmd = [sys.executable, "-m", "bulkhead.cli", "serve", "--role", role, "--router", control_address,
                   "--cluster-key-file", str(key_file), "--worker-name", f"{role}-{i}",
                   "--kv-memory", getattr(args, f"{role}_kv_memory") or args.kv_memory,
                   "--drain-lease", str(args.drain_lease)]
            for flag in _ENGINE_VALUE_FLAGS:
                value = threads if flag == "threads" else getattr(args, flag)
                if value is not None:
                    cmd += [f"--{flag.replace('_', '-')}", str(value)]
            cmd += [f"--{flag.replace('_', '-')}" for flag in _ENGINE_SWITCHES if getattr(args, flag)]
            procs.append(subprocess.Popen(cmd, preexec_fn=_die_with_parent))
    return procs
