"""The same deployment with KV moved over the tcp backend (decode's receiver
asks its write guard before every page lands)."""

import time

import openai
import pytest

from tests.server_process import ServerProcess
from tests.conftest import openai_client, write_keys_file

MODEL = "SmolLM2-135M-Instruct"
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tcp_cluster(tmp_path_factory, smollm2_dir):
    d = tmp_path_factory.mktemp("tcp-cluster")
    faults = d / "faults"
    proc = ServerProcess(
        ["--role", "local", "--transfer", "tcp", "--api-keys", str(write_keys_file(d)), "--scrub-mode", "poison",
         "--kv-memory", "128MiB", "--context-length", "1024", "--threads", "1",
         "--cluster-key-file", str(d / "cluster.key")],
        d / "cluster.log", env={"BULKHEAD_FAULTS_FILE": str(faults)},
    ).wait_ready(timeout=300)
    proc.faults_file = faults
    yield proc
    proc.stop()


def decode_counter(cluster, name):
    return sum(w["counters"].get(name, 0) for w in cluster.info()["workers"] if w["role"] == "decode")


def test_kv_moves_over_tcp_and_verifies(tcp_cluster):
    client = openai_client(tcp_cluster.url, "sk-alpha-test")
    r = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=30,
                                       messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in r.choices[0].message.content
    deadline = time.monotonic() + 5
    while decode_counter(tcp_cluster, "commits") < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert decode_counter(tcp_cluster, "commits") >= 1


def test_a_corrupted_page_over_tcp_fails_closed(tcp_cluster):
    client = openai_client(tcp_cluster.url, "sk-alpha-test")
    tcp_cluster.faults_file.write_text("corrupt_page\n")
    try:
        with pytest.raises(openai.InternalServerError) as e:
            client.completions.create(model=MODEL, prompt="Tell me about the sea. " * 5, max_tokens=4)
    finally:
        tcp_cluster.faults_file.unlink()
    assert e.value.body["code"] == "kv_transfer_failed"
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert r.choices[0].text
