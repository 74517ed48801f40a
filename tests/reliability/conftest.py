import pytest

from bench.soak import server_flags, tenant_keys, write_keys
from tests.server_process import ServerProcess

CONTEXT_LENGTH = 512  # short prompts keep the soak's requests quick on two shared cores


@pytest.fixture(scope="session")
def soak_keys() -> dict[str, str]:
    return tenant_keys(8)


@pytest.fixture(scope="session")
def soak_server(tmp_path_factory, soak_keys, smollm2_dir):
    """One disaggregated server (router + prefill + decode, prefix cache on in prefill,
    poisoned scrubbing, 8 tenants) shared by the soak and the side-channel test."""
    d = tmp_path_factory.mktemp("soak")
    proc = ServerProcess(server_flags("local", write_keys(soak_keys, d / "keys.toml"), CONTEXT_LENGTH),
                         d / "server.log").wait_ready(timeout=300)
    yield proc
    proc.stop()
