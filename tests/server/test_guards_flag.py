"""`--unsafe-no-guards` (benchmark only): shown in /server_info, off by
default, and refused where there is more than one tenant."""

import logging

import pytest
from fastapi.testclient import TestClient

from bulkhead.cli import build_parser
from bulkhead.engine.builder import GUARDS_OFF_WARNING, build_engine
from bulkhead.server.app import ServerState, create_app
from bulkhead.server.local_backend import LocalBackend
from bulkhead.launch.engine_flags import engine_config
from bulkhead.launch.serve import serve
from tests.conftest import write_keys_file


def server_info(model_dir, *flags) -> dict:
    args = build_parser().parse_args(["serve", "--role", "colocated", "--model", str(model_dir),
                                      "--kv-memory", "64MiB", *flags])
    built = build_engine(engine_config(args, model_dir, "tiny"))
    app = create_app(ServerState(LocalBackend(built, "tiny", "single_tenant_loopback"), None))
    with TestClient(app) as http:
        return http.get("/server_info").json()


def test_normal_serving_has_every_guard_on(tiny_model_dir):
    info = server_info(tiny_model_dir)
    assert info["guards"] == "on" and info["safe_mode"] is True and info["scrub_mode"] == "zero"


def test_unsafe_no_guards_shows_in_server_info_and_is_logged_loudly(tiny_model_dir, caplog):
    with caplog.at_level(logging.WARNING):
        info = server_info(tiny_model_dir, "--unsafe-no-guards")
    assert info["guards"] == "off" and info["safe_mode"] is False
    assert GUARDS_OFF_WARNING in caplog.text


def test_unsafe_no_guards_is_refused_with_api_keys(tmp_path, caplog):
    keys = write_keys_file(tmp_path)
    args = build_parser().parse_args(["serve", "--role", "colocated", "--api-keys", str(keys), "--unsafe-no-guards"])
    with caplog.at_level(logging.ERROR):
        assert serve(args) == 2  # before any model is loaded
    assert "refusing --unsafe-no-guards with API keys" in caplog.text


@pytest.mark.e2e
def test_unsafe_no_guards_reaches_every_disaggregated_worker(tmp_path, tiny_model_dir):
    from tests.server_process import ServerProcess
    from tests.conftest import openai_client
    from tests.disagg.cluster_tools import total, wait_for

    flags = ["--role", "local", "--model", str(tiny_model_dir), "--model-id", "tiny", "--kv-memory", "64MiB",
             "--threads", "1", "--unsafe-no-guards", "--cluster-key-file", str(tmp_path / "cluster.key")]
    proc = ServerProcess(flags, tmp_path / "local.log").wait_ready(timeout=300)
    try:
        done = openai_client(proc.url, "unused").completions.create(model="tiny", prompt="Hello", max_tokens=4)
        assert done.choices[0].finish_reason in ("length", "stop")
        info = proc.info()
        assert info["guards"] == "off"
        assert sorted(w["guards"] for w in info["workers"]) == ["off", "off"]
        # Worker counters ride on heartbeats (every 0.5 s): wait for the one after the commit.
        commits = wait_for(lambda: total(proc, "commits", role="decode"), what="decode heartbeat with the commit")
        assert commits == 1  # committed without digests
        assert "ISOLATION GUARDS OFF" in proc.log()
    finally:
        proc.stop()
