"""One worker process's configuration, fixed at start-up.

A worker started by hand on its own host (`bulkhead serve --role prefill
--router ...`) builds it from its command line; a worker that `--role
local` spawns gets it whole, as JSON (`--worker-config`), so every engine
setting the launcher has reaches the worker without a list of flags to keep
in step with the parser.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from bulkhead.engine.engine_config import EngineConfig

ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class WorkerConfig:
    role: str                 # "prefill" or "decode"
    name: str                 # unique among the router's workers; registration and metrics use it
    router: str               # the router's control address (tcp://HOST:PORT)
    cluster_key_file: Path    # the HMAC key shared with the router (hex)
    engine: EngineConfig      # this worker's own pool, kernels and limits
    # decode: the backend its pool is exposed through (shm: same host).
    transfer: str = "shm"
    # decode: how long an unacknowledged writer may still write a failed
    # request's pages; grants tell writers to start within a third of it.
    drain_lease_s: float = 30.0
    log_level: str = "info"
    # SIGTERM drains: the router assigns nothing more, what is held
    # finishes, then the process exits; at the latest after this long.
    drain_deadline_s: float = 60.0
    # decode: the address its tcp or mooncake receiver listens on and tells
    # writers; loopback unless the operator names one (another host's
    # prefill must reach it: this host's address on their shared network).
    transfer_host: str = "127.0.0.1"
    transfer_port: int = 0  # decode: its receiver's port (0: any free one, told to writers)
    # mooncake: start although this host has interfaces other than lo.
    # Mooncake listens on every interface whatever it is told; across hosts
    # that is the data network, so the operator says so explicitly.
    transfer_all_interfaces: bool = False
    # The forensic page-lineage log (bulkhead.lineage): the deployment's
    # --lineage-log PATH; this worker writes its own file, its name before
    # PATH's suffix (chain.worker_log_path). None = no log.
    lineage_log: str | None = None
    lineage_key_file: str | None = None  # the lineage's own HMAC key, never the cluster key
    lineage_max_bytes: int = 64 * 2**20  # a segment this big is rotated; the chain continues

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"a worker's role is one of {ROLES}, not {self.role!r}")
        if not self.router:
            raise ValueError(f"--role {self.role} needs --router tcp://HOST:PORT")
        if self.drain_lease_s <= 0:
            raise ValueError(f"--drain-lease must be positive, not {self.drain_lease_s}")
        if self.drain_deadline_s < 0:
            raise ValueError(f"--drain-deadline must be >= 0, not {self.drain_deadline_s}")
        if self.lineage_log and not self.lineage_key_file:
            raise ValueError("--lineage-log needs --lineage-key FILE")

    def to_json(self) -> str:
        body = asdict(self)
        body["cluster_key_file"] = str(self.cluster_key_file)
        body["engine"]["model_dir"] = str(self.engine.model_dir)
        return json.dumps(body, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        body = json.loads(text)
        engine = body.pop("engine")
        known = {f.name for f in fields(EngineConfig)}
        unknown = set(engine) - known
        if unknown:
            raise ValueError(f"--worker-config: unknown engine settings {sorted(unknown)}")
        engine = EngineConfig(**{**engine, "model_dir": Path(engine["model_dir"])})
        return cls(**{**body, "cluster_key_file": Path(body["cluster_key_file"]), "engine": engine})
