import pytest

from bulkhead.engine.builder import KV_DTYPE_AUTO
from bulkhead.kv.layout import KVLayout
from tests.server_process import ServerProcess
from tests.conftest import openai_client, write_keys_file
from tests.disagg.cluster_tools import wait_workers_idle
SMOLLM2_KV = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, page_size=16, dtype=KV_DTYPE_AUTO)
PREFILL_POOL_TOKENS = 1024  # smaller than decode's ...
DECODE_POOL_TOKENS = 2048  # ... smaller than the model's 8192-token context: the incident's shape


@pytest.fixture(scope="session")
def cluster(tmp_path_factory, smollm2_dir):
    """router + 2 prefill + 2 decode processes, KV moved through shared memory,
    every freed page poisoned; pools sized like the incident (clamped)."""
    d = tmp_path_factory.mktemp("cluster")
    keys = write_keys_file(d)
    faults = d / "faults"
    proc = ServerProcess(
        ["--role", "local", "--prefill", "2", "--decode", "2", "--api-keys", str(keys), "--scrub-mode", "poison",
         "--prefill-kv-memory", str(SMOLLM2_KV.bytes_per_token * PREFILL_POOL_TOKENS),
         "--decode-kv-memory", str(SMOLLM2_KV.bytes_per_token * DECODE_POOL_TOKENS),
         "--kv-memory", "1GiB", "--clamp-context-length", "--drain-lease", "3", "--threads", "1",
         "--cluster-key-file", str(d / "cluster.key")],
        d / "cluster.log", env={"BULKHEAD_FAULTS_FILE": str(faults)},
    ).wait_ready(timeout=300)
    proc.faults_file = faults
    yield proc
    try:
        assert proc.metric("bulkhead_engine_failures_total") == 0, "a step read poisoned KV"
        wait_workers_idle(proc)
    finally:
        proc.stop()


@pytest.fixture
def alpha(cluster):
    return openai_client(cluster.url, "sk-alpha-test")


@pytest.fixture
def beta(cluster):
    return openai_client(cluster.url, "sk-beta-test")
