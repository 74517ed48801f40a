"""The deployment the fault matrix runs against: a router and four workers
started as separate processes (as on separate hosts), so a test can kill -9
any of them, the router included, and start a replacement with the same
command line.

Pools: prefill 2048 tokens, decode 512 tokens (32 pages), both clamped (the
cluster advertises 512), so one ~420-token prompt nearly fills a decode pool
(the pool-exhaustion scenario) and prompts stay cheap on a busy machine;
every freed page is poisoned (NaN), so a step that read one fails and is
counted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bulkhead.disagg.launch import _die_with_parent
from bulkhead.engine.builder import KV_DTYPE_AUTO
from bulkhead.kv.layout import KVLayout
from tests.server_process import HARNESS, ROOT, ServerProcess, free_port
from tests.conftest import openai_client, write_keys_file
from tests.disagg.cluster_tools import wait_for

MODEL = "SmolLM2-135M-Instruct"
SMOLLM2_KV = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, page_size=16, dtype=KV_DTYPE_AUTO)
POOL_TOKENS = {"prefill": 2048, "decode": 512}
WORKERS = ("prefill-0", "prefill-1", "decode-0", "decode-1")
DRAIN_LEASE_S = 3  # decode's fence for an unacknowledged writer; grants say write_within_s = lease / 3
# Every lost control message ends at this deadline (typed 504); long enough
# for the matrix's short requests on a busy 2-core machine.
REQUEST_TIMEOUT_S = 10


class FaultCluster:
    def __init__(self, directory: Path, keys: Path | None = None, model_args: tuple[str, ...] = ()):
        """keys: the keys file (default: the two test tenants); model_args:
        flags every process gets (another model, as tests/lora's cluster does)."""
        self.dir = Path(directory)
        self.keys = keys or write_keys_file(self.dir)
        self.model_args = list(model_args)
        self.key_file = self.dir / "cluster.key"
        self.faults_file = self.dir / "faults"
        self.control = f"tcp://127.0.0.1:{free_port()}"
        self.env = {"BULKHEAD_FAULTS_FILE": str(self.faults_file)}
        self.router: ServerProcess | None = None
        self.workers: dict[str, subprocess.Popen] = {}
        self._logs = []

    # -- processes ------------------------------------------------------------
    def start_router(self) -> None:
        # The key file is created by the first process that needs it; the
        # router starts first, so workers read the same key.
        n = len(list(self.dir.glob("router*.log")))
        self.router = ServerProcess(
            ["--role", "router", "--control-address", self.control, "--api-keys", str(self.keys),
             "--cluster-key-file", str(self.key_file), "--request-timeout", str(REQUEST_TIMEOUT_S),
             *self.model_args],
            self.dir / f"router{n}.log", env=self.env,
        ).wait_ready(timeout=120)

    def worker_command(self, name: str) -> list[str]:
        """What `bulkhead serve --role local` would run for this worker
        (disagg/launch.py), through the fault harness's entry."""
        role = name.split("-")[0]
        return [sys.executable, "-m", HARNESS, "serve", "--role", role, "--router", self.control,
                "--cluster-key-file", str(self.key_file), "--worker-name", name,
                "--kv-memory", str(SMOLLM2_KV.bytes_per_token * POOL_TOKENS[role]),
                "--drain-lease", str(DRAIN_LEASE_S), "--scrub-mode", "poison", "--clamp-context-length",
                "--threads", "1", *self.model_args]

    def start_worker(self, name: str) -> subprocess.Popen:
        log = open(self.dir / f"{name}.{len(self._logs)}.log", "w")
        self._logs.append(log)
        proc = subprocess.Popen(self.worker_command(name), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, **self.env}, preexec_fn=_die_with_parent)
        self.workers[name] = proc
        return proc

    def kill_worker(self, name: str) -> None:
        proc = self.workers[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def exited_worker(self) -> str:
        """The one worker whose process is gone (a crash fault fired in it)."""
        return wait_for(lambda: next((n for n, p in self.workers.items() if p.poll() is not None), None),
                        what="a worker to exit")

    def kill_router(self) -> None:
        self.router.proc.send_signal(signal.SIGKILL)
        self.router.proc.wait(timeout=30)
        self.router._log.close()

    def wait_registered(self, names=WORKERS, timeout: float = 180.0) -> None:
        """Every named worker registered with the current router and heartbeating."""
        def ready():
            live = {w["name"] for w in self.info()["workers"] if not w["lost"]}
            return set(names) <= live
        wait_for(ready, timeout=timeout, what=f"workers {names} registered")

    def stop(self) -> None:
        if self.router is not None:
            self.router.proc.terminate()  # all at once: each waits for its own shutdown
        for proc in self.workers.values():
            proc.terminate()
        for proc in self.workers.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.router is not None:
            self.router.stop()
        for log in self._logs:
            log.close()

    # -- the HTTP side --------------------------------------------------------
    @property
    def url(self) -> str:
        return self.router.url

    @property
    def port(self) -> int:
        return self.router.port

    def info(self) -> dict:
        return self.router.info()

    def client(self, key: str = "sk-alpha-test"):
        return openai_client(self.url, key)

    def crashed(self) -> list[str]:
        """Crash faults that fired, in order (tests/faults/harness.py writes them before os._exit)."""
        path = Path(f"{self.faults_file}.crashed")
        return path.read_text().split() if path.exists() else []


def start_fault_cluster(directory: Path) -> FaultCluster:
    cluster = FaultCluster(directory)
    try:
        cluster.start_router()
        for name in WORKERS:
            cluster.start_worker(name)
        cluster.wait_registered(timeout=300)
    except BaseException:
        cluster.stop()
        raise
    time.sleep(0.6)  # one heartbeat: counters and page states are in /server_info
    return cluster
