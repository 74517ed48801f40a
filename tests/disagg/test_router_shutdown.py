"""SIGTERM on the router of the default deployment: it stops accepting,
lets the request in flight finish with every token, then stops the workers
it started (each drains and exits) and exits 0 itself."""

import signal
import subprocess
import threading
import time

import httpx
import pytest

from tests.conftest import openai_client, write_keys_file
from tests.server_process import ServerProcess

pytestmark = pytest.mark.e2e


def _worker_pids(port: int) -> list[int]:
    control = f"tcp://127.0.0.1:{port + 1}"  # the router's control address (disagg/launch.py)
    out = subprocess.run(["pgrep", "-f", f'"router": "{control}"'], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_sigterm_on_the_router_finishes_the_request_in_flight_then_stops_its_workers(tmp_path, smollm2_dir):
    proc = ServerProcess(["--role", "local", "--api-keys", str(write_keys_file(tmp_path)), "--kv-memory", "64MiB",
                          "--context-length", "512", "--threads", "1",
                          "--cluster-key-file", str(tmp_path / "cluster.key")],
                         tmp_path / "server.log").wait_ready(timeout=300)
    try:
        workers = _worker_pids(proc.port)
        assert len(workers) == 2
        result = {}

        def long_request():
            r = openai_client(proc.url, "sk-alpha-test").completions.create(
                model="SmolLM2-135M-Instruct", prompt="Count slowly:", max_tokens=48, temperature=0,
                extra_body={"ignore_eos": True})
            result["tokens"] = r.usage.completion_tokens

        client = threading.Thread(target=long_request)
        client.start()
        time.sleep(1.0)  # the request is in flight
        proc.proc.send_signal(signal.SIGTERM)
        client.join(timeout=120)
        assert result.get("tokens") == 48, proc.log()[-3000:]  # finished, every token
        assert proc.proc.wait(timeout=120) == 0, proc.log()[-3000:]
        with pytest.raises(httpx.HTTPError):  # no longer accepting
            httpx.get(proc.url + "/health", timeout=2)
        deadline = time.monotonic() + 30
        while _worker_pids(proc.port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _worker_pids(proc.port) == []  # its workers drained and exited
        assert "killing it" not in proc.log()  # none had to be killed
    finally:
        proc.stop()
