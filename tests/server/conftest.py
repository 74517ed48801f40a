import pytest

from tests.server_process import ServerProcess
from tests.conftest import openai_client, write_keys_file
from tests.server.tiny_server import LONG_CONTEXT, make_long_tiny_model, start_tiny_server, stop_checked


@pytest.fixture(scope="session")
def keys_file(tmp_path_factory):
    return write_keys_file(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="session")
def server(tmp_path_factory, keys_file, smollm2_dir):
    """The real server with the real model; every e2e test runs with poisoned scrubbing."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    proc = ServerProcess(
        ["--role", "colocated", "--api-keys", str(keys_file), "--scrub-mode", "poison", "--kv-memory", "256MiB",
         "--context-length", "2048", "--max-running", "16"],
        log,
    ).wait_ready()
    yield proc
    try:
        # Poison mode: a single stale read would have failed a step closed.
        assert proc.metric("bulkhead_engine_failures_total") == 0, proc.log()
        assert "non-finite" not in proc.log()
        proc.wait_idle()
    finally:
        proc.stop()


@pytest.fixture
def client(server):
    return openai_client(server.url, "sk-alpha-test")


@pytest.fixture
def beta_client(server):
    return openai_client(server.url, "sk-beta-test")


@pytest.fixture(scope="session")
def long_tiny_model_dir(tmp_path_factory, smollm2_dir):
    return make_long_tiny_model(tmp_path_factory.mktemp("tiny-long"), smollm2_dir)


@pytest.fixture(scope="session")
def tiny_server(tmp_path_factory, long_tiny_model_dir):
    """bulkhead serve over a tiny random model: bad input, tenancy, requests by id.
    Prefix cache on, so a client cache_salt can be shown not to cross tenants."""
    proc = start_tiny_server(tmp_path_factory.mktemp("tiny-server"), long_tiny_model_dir,
                             "--context-length", str(LONG_CONTEXT), "--prefix-cache", "on")
    yield proc
    stop_checked(proc)
