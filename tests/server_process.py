"""Run `bulkhead serve` as a child process (end-to-end tests, benchmarks).

With BULKHEAD_FAULTS_FILE in its environment the child is the fault
matrix's harness (tests/faults/serve.py): the same server with fault
injectors installed at its seams (bulkhead/seams.py). Without it, the child
is the production command line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent  # the harness's entry module is importable from here
FAULTS_ENV = "BULKHEAD_FAULTS_FILE"
PRODUCTION, HARNESS = "bulkhead.cli", "tests.faults.serve"
# Every server a test starts takes this operator key (through the
# environment, whatever keys file the test writes), and info() and metric()
# send it: with API keys on, /server_info and /metrics need one.
OPERATOR_KEY = "sk-operator-test"
OPERATOR_ENV = {"BULKHEAD_OPERATOR_KEYS": f"{OPERATOR_KEY}=test-harness"}
OPERATOR_HEADERS = {"Authorization": f"Bearer {OPERATOR_KEY}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, args: list[str], log_path: Path, env: dict | None = None):
        self.args, self.env, self.log_path = args, env, log_path
        self._launch()

    def _launch(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(self.log_path, "w")
        entry = HARNESS if (self.env or {}).get(FAULTS_ENV) else PRODUCTION
        cmd = [sys.executable, "-m", entry, "serve", "--port", str(self.port), *self.args]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT,
                                     env={**os.environ, **OPERATOR_ENV, **(self.env or {})})

    def wait_ready(self, timeout: float = 180.0) -> ServerProcess:
        deadline = time.monotonic() + timeout
        retries = 2
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                # free_port() cannot reserve the port; another process may take it first.
                if retries and "address already in use" in self.log().lower():
                    retries -= 1
                    self._log.close()
                    self._launch()
                    continue
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        log = self.log()
        # Stopped here: a fixture whose setup raises never reaches the teardown that
        # would stop it, and a server left running keeps its KV pool in /dev/shm.
        self.stop()
        raise TimeoutError(f"server not ready after {timeout}s:\n{log}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def info(self) -> dict:
        return httpx.get(self.url + "/server_info", headers=OPERATOR_HEADERS, timeout=5).json()

    def metric(self, name: str, **labels) -> float:
        """Sum of a Prometheus sample's values over series matching the labels."""
        text = httpx.get(self.url + "/metrics", headers=OPERATOR_HEADERS, timeout=5).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith("#") or not line.startswith(name):
                continue
            series, value = line.rsplit(" ", 1)
            if series.split("{")[0] != name:
                continue
            if all(f'{k}="{v}"' in series for k, v in labels.items()):
                total += float(value)
        return total

    def wait_idle(self, timeout: float = 30.0) -> dict:
        """Wait until no request holds pages; returns /server_info."""
        deadline = time.monotonic() + timeout
        info = self.info()
        while info["owned_pages"] or info["dirty_pages"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"pages still held: {info}")
            time.sleep(0.1)
            info = self.info()
        return info

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()
