"""Start the disaggregated roles: router, prefill worker, decode worker, or all
of them on this machine (`--role local`, the default of `bulkhead serve`)."""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import typing
from dataclasses import replace
from pathlib import Path

from bulkhead.disagg.signing import Signer, load_or_create_key
from bulkhead.disagg.worker_config import WorkerConfig
from bulkhead.model.gguf_import import cache_root, heartbeat
from bulkhead.seams import PRODUCTION, Seams

log = logging.getLogger("bulkhead")


def cluster_key(args) -> bytes:
    return load_or_create_key(args.cluster_key_file or cache_root() / "cluster.key")


def worker_config_from_args(args, engine_config) -> WorkerConfig:
    """A worker started by hand, on its own host: its command line."""
    return WorkerConfig(args.role, args.worker_name or f"{args.role}-{os.getpid()}", args.router or "",
                        args.cluster_key_file or cache_root() / "cluster.key", engine_config,
                        transfer_host=args.transfer_host, transfer_port=args.transfer_port,
                        transfer_all_interfaces=args.transfer_all_interfaces, **_flag_settings(args))


def _flag_settings(args) -> dict:
    """The WorkerConfig fields every worker, local or by hand, takes from the flags as they are."""
    return {"transfer": args.transfer, "drain_lease_s": args.drain_lease, "log_level": args.log_level,
            "drain_deadline_s": args.drain_deadline, "lineage_log": str(args.lineage_log) if args.lineage_log else None,
            "lineage_key_file": str(args.lineage_key) if args.lineage_key else None,
            "lineage_max_bytes": args.lineage_max_bytes}


def worker_lineage(config: WorkerConfig):
    """This worker's own lineage log (or the no-op sink)."""
    from bulkhead.lineage.chain import worker_log_path
    from bulkhead.lineage.writer import open_lineage

    path = worker_log_path(Path(config.lineage_log), config.name) if config.lineage_log else None
    return open_lineage(path, config.lineage_key_file, config.lineage_max_bytes, config.name)


def serve_worker(config: WorkerConfig, seams: Seams = PRODUCTION) -> typing.NoReturn:
    log.info("%s: building its engine (%s)", config.name, config.engine.model_dir.name)
    with heartbeat(f"building {config.name}'s engine", "importing torch, reading the weights, zeroing the KV pool",
                   log):
        worker = build_worker(config, seams)
    log.info("%s: engine built, registering with the router at %s", config.name, config.router)
    # SIGTERM drains, then exits (bounded by the deadline); a second one exits now.
    signal.signal(signal.SIGTERM, lambda *_: worker.leave(config.drain_deadline_s))
    try:
        worker.run()
    finally:
        if config.role == "decode":
            worker.target.close()
        worker.lineage.close()
    # Everything the worker owns is closed. Exit here, not through the
    # interpreter's teardown: there ZeroMQ's and torch's native threads met
    # static destructors once and aborted a drained worker (SIGABRT,
    # "terminate called without an active exception"), turning a clean drain
    # into exit status -6 (tests/disagg/test_multihost.py, once in a fresh clone).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def build_worker(config: WorkerConfig, seams: Seams = PRODUCTION):
    """A prefill or decode worker with its engine (and, for decode, the
    transfer target whose storage holds the engine's pool)."""
    from bulkhead.disagg.decode_worker import DecodeWorker
    from bulkhead.disagg.prefill_worker import PrefillWorker
    from bulkhead.engine.builder import build_engine  # torch: only a worker loads it, never the router

    signer = Signer(load_or_create_key(config.cluster_key_file), config.name)
    lineage = worker_lineage(config)
    if config.role == "decode":
        from bulkhead.disagg.transfer import make_target

        holder = {}
        if config.transfer == "shm":
            from bulkhead.disagg.transfer.shm import sweep_stale_files

            for path in sweep_stale_files():  # pools of decode workers that were killed
                log.info("removed stale KV pool file %s", path)

        def pool_factory(layout, num_pages, scrub_mode):
            opts = {"shm": {}, "tcp": {"host": config.transfer_host, "port": config.transfer_port},
                    "mooncake": {"host": config.transfer_host,
                                 "allow_all_interfaces": config.transfer_all_interfaces}}[config.transfer]
            holder["target"] = make_target(config.transfer, layout, num_pages, scrub_mode, **opts)
            return holder["target"].pool

        built = build_engine(config.engine, pool_factory=pool_factory, seams=seams, lineage=lineage,
                             decode_only=True)
        return DecodeWorker(built, config.engine.model_id, signer, config.router, target=holder["target"],
                            drain_lease_s=config.drain_lease_s, seams=seams)
    built = build_engine(config.engine, prefill_only=True, seams=seams, lineage=lineage)
    mooncake = {"host": config.transfer_host, "allow_all_interfaces": config.transfer_all_interfaces}
    return PrefillWorker(built, config.engine.model_id, signer, config.router, seams=seams,
                         source_options={"mooncake": mooncake})


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: no orphaned workers


def worker_threads(args) -> int:
    """Torch threads per local worker: --threads, else every core where the
    workers take turns with them (--core-sharing lease), else the cores split
    among the workers. Two workers with two threads each on two cores and no
    lease halve each other whenever a prefill and a decode pass overlap, and
    each pays for the other's spinning OpenMP workers: at 16 clients, 1
    thread each served 105.9 tok/s against 76.8 with 2 (same run; 31.1 vs
    31.0 at 1)."""
    if args.threads:
        return args.threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if args.core_sharing == "lease":
        return cores
    return max(1, cores // max(1, args.prefill + args.decode))


def core_lease_path(args) -> str | None:
    """The lock file the local workers' passes take turns on (--core-sharing
    lease), in a directory of this launch's own: another deployment on the
    host never shares it. Removed when the launcher exits."""
    if args.core_sharing != "lease":
        return None
    where = tempfile.mkdtemp(prefix="bulkhead-cores-")
    atexit.register(shutil.rmtree, where, True)
    return os.path.join(where, "lease")


def spawn_workers(args, control_address: str, key_file: Path, engine_configs: dict,
                  seams: Seams = PRODUCTION) -> list[subprocess.Popen]:
    """Start --prefill and --decode worker processes, each with its whole
    WorkerConfig; engine_configs: the engine configuration of each role."""
    procs = []
    threads, lease = worker_threads(args), core_lease_path(args)
    for role, count in (("prefill", args.prefill), ("decode", args.decode)):
        for i in range(count):
            engine = replace(engine_configs[role], threads=threads, core_lease=lease)
            config = WorkerConfig(role, f"{role}-{i}", control_address, key_file, engine, **_flag_settings(args))
            cmd = [*seams.worker_command, "serve", "--role", role, "--worker-config", config.to_json()]
            procs.append(subprocess.Popen(cmd, preexec_fn=_die_with_parent))
            log.info("started worker %s (pid %d); serving once every worker has registered", config.name,
                     procs[-1].pid)
    return procs
