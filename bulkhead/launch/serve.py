"""`bulkhead serve`: check the flags, wire the role's components, serve."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path

import uvicorn

from bulkhead.launch.engine_flags import engine_config
from bulkhead.launch.refusals import check_lineage_flags, load_keys, log_keys
from bulkhead.lineage.writer import LineageLogError
from bulkhead.lora.peft_files import BaseShapes
from bulkhead.lora.registry import AdapterRegistry
from bulkhead.model.config import load_model_config
from bulkhead.model.gguf_import import DEFAULT_MODEL_ID, resolve_model
from bulkhead.seams import PRODUCTION, Seams
from bulkhead.server.app import ServerState, create_app
from bulkhead.server.auth import KeyStore

log = logging.getLogger("bulkhead")


class BoundServer(uvicorn.Server):
    """Says where it serves (on_bound) only once uvicorn has bound every
    socket, and not at all when binding failed: "serving on ..." before the
    bind would announce a server that a busy port stops one line later."""

    def __init__(self, config: uvicorn.Config, on_bound: Callable[[], None]):
        super().__init__(config)
        self.on_bound = on_bound

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:  # set by uvicorn once every socket is listening
            self.on_bound()


def serve(args: argparse.Namespace, seams: Seams = PRODUCTION) -> int:
    """Start the role args.role asks for. seams: components a test harness
    swaps in (bulkhead/seams.py); production passes none."""
    try:
        return _serve(args, seams)
    except LineageLogError as e:  # a lineage log or key it cannot open: a refusal, as a bad flag is
        log.error("refusing to start: %s", e)
        return 2


def _serve(args: argparse.Namespace, seams: Seams) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    model_dir = resolve_model(args.model)  # a .gguf file: its weights are read from it as stored
    model_id = args.model_id or (DEFAULT_MODEL_ID if args.model is None
                                 else Path(args.model).name.removesuffix(".gguf"))
    if args.role in ("prefill", "decode"):
        return _serve_worker(args, model_dir, model_id, seams)
    if (problem := check_lineage_flags(args)) is not None:
        log.error("refusing to start: %s", problem)
        return 2
    keys, refusal = load_keys(args, model_id)
    if refusal is not None:
        log.error("%s", refusal)
        return 2
    auth = "api_keys" if keys else "single_tenant_loopback"
    workers = []
    if args.role == "colocated":
        from bulkhead.launch.colocated import colocated_backend, serve_colocated

        backend = colocated_backend(engine_config(args, model_dir, model_id), model_id, auth,
                                    (args.lineage_log, args.lineage_key, args.lineage_max_bytes), seams)
    else:
        from bulkhead.launch.disaggregated import router_backend, serve_router

        backend, workers = router_backend(args, model_dir, model_id, auth, seams)
    state = ServerState(backend, keys, seams, default_max_tokens=args.default_max_tokens,
                        adapters=tenant_adapters(keys, model_dir))
    log_keys(keys)
    config = uvicorn.Config(create_app(state), host=args.host, port=args.port, log_level=args.log_level,
                            access_log=False)
    server = BoundServer(config, lambda: log.info("serving %s (%s) on http://%s:%d/v1", model_id, args.role,
                                                  args.host, args.port))
    state.stopping = lambda: server.should_exit  # SIGTERM: /ready is 503 while in-flight requests finish
    if args.role == "colocated":
        return serve_colocated(backend, server)
    return serve_router(backend, workers, server, args.transfer)


def _serve_worker(args: argparse.Namespace, model_dir: Path, model_id: str, seams: Seams) -> int:
    """--role prefill or decode: one worker process (bulkhead.disagg.launch)."""
    from bulkhead.disagg.launch import serve_worker, worker_config_from_args
    from bulkhead.disagg.worker_config import WorkerConfig

    try:
        config = (WorkerConfig.from_json(args.worker_config) if args.worker_config
                  else worker_config_from_args(args, engine_config(args, model_dir, model_id)))
    except ValueError as e:
        log.error("%s", e)
        return 2
    logging.getLogger().setLevel(config.log_level.upper())
    return serve_worker(config, seams)


def tenant_adapters(keys: KeyStore | None, model_dir: Path) -> AdapterRegistry | None:
    """The tenants' LoRA adapters, a registry following keys.toml; None
    without keys: adapters belong to tenants, and there are none."""
    if keys is None:
        return None
    registry = AdapterRegistry(BaseShapes.of(load_model_config(model_dir))).follow(keys)
    if loaded := registry.loaded():
        log.info("LoRA adapters: %d (%s)", len(loaded), ", ".join(sorted(f"{a.tenant}/{a.name}" for a in loaded)))
    return registry
