"""shm and tcp details that need no second process: naming, cleanup, authentication, layout checks."""

import json
import os

import pytest
import torch

from bulkhead.disagg.transfer import TransferError, make_source, make_target
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.pool import KVPool

LAYOUT = KVLayout(num_layers=2, num_kv_heads=1, head_dim=4, page_size=2, dtype="float32")


def _src(layout=LAYOUT, num_pages=4):
    pool = KVPool(layout, num_pages)
    pool.data.normal_()
    return pool


@pytest.fixture
def tcp_target():
    target = make_target("tcp", LAYOUT, 8)
    yield target
    target.close()


def test_shm_file_is_private_named_for_this_process_and_removed_on_close():
    target = make_target("shm", LAYOUT, 8)
    path = target.descriptor()["path"]
    assert os.path.basename(path).startswith(f"bulkhead-kv-{os.getpid()}-")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert not target.sees_writes
    json.dumps(target.descriptor())
    target.close()
    target.close()  # idempotent
    assert not os.path.exists(path)


def test_shm_source_never_writes_into_a_file_the_descriptor_does_not_name():
    target = make_target("shm", LAYOUT, 8)
    desc = target.descriptor()
    target.close()
    with open(desc["path"], "wb") as f:  # a different file at the same path (a stale or hostile one)
        f.write(b"\0" * (2 * 2 * 8 * 2 * 4 * 4))
    try:
        with pytest.raises(TransferError, match="not the pool"):
            make_source("shm").write_pages(desc, "r", _src(), [0], [0], [1])
    finally:
        os.unlink(desc["path"])


def test_shm_closed_target_is_an_error_not_a_silent_write():
    target = make_target("shm", LAYOUT, 8)
    source = make_source("shm")
    source.write_pages(target.descriptor(), "r", _src(), [0], [3], [1])
    target.close()
    with pytest.raises(TransferError, match="closed"):
        source.write_pages(target.descriptor(), "r", _src(), [0], [3], [1])


def test_tcp_listens_on_loopback_by_default(tcp_target):
    assert tcp_target.descriptor()["host"] == "127.0.0.1"
    assert tcp_target.sees_writes
    json.dumps(tcp_target.descriptor())


def test_tcp_wrong_token_writes_nothing(tcp_target):
    before = tcp_target.pool.data.clone()
    forged = {**tcp_target.descriptor(), "token": "0" * 32}
    with pytest.raises(TransferError):
        make_source("tcp", timeout_s=5).write_pages(forged, "r", _src(), [0, 1], [2, 3], [1, 1])
    assert torch.equal(before, tcp_target.pool.data)
    assert tcp_target.stats()["bad_frames"] == 1


def test_tcp_receiver_refuses_a_different_page_layout_and_keeps_serving(tcp_target):
    source = make_source("tcp", timeout_s=5)
    other = KVLayout(num_layers=2, num_kv_heads=1, head_dim=4, page_size=4, dtype="float32")
    desc = {**tcp_target.descriptor(), "shape": [8, 2, 2, 4, 1, 4]}  # lie past the source-side check
    with pytest.raises(TransferError, match="layouts differ"):
        source.write_pages(desc, "r", _src(other), [0], [1], [1])
    src = _src()
    source.write_pages(tcp_target.descriptor(), "r", src, [1], [1], [1])
    assert torch.equal(tcp_target.pool.data[1], src.data[1])


def test_tcp_guard_that_raises_fails_closed(tcp_target):
    def broken_guard(page, generation, request_id):
        raise KeyError(page)

    tcp_target.set_write_guard(broken_guard)
    before = tcp_target.pool.data.clone()
    with pytest.raises(TransferError, match="refused") as e:
        make_source("tcp", timeout_s=5).write_pages(tcp_target.descriptor(), "r", _src(), [0], [4], [1])
    assert e.value.refused_pages == (4,)
    assert torch.equal(before, tcp_target.pool.data)


def test_tcp_guard_sees_page_generation_and_request(tcp_target):
    seen = []
    tcp_target.set_write_guard(lambda *args: seen.append(args) or True)
    make_source("tcp", timeout_s=5).write_pages(tcp_target.descriptor(), "req-9", _src(), [0, 1], [6, 2], [3, 4])
    assert seen == [(6, 3, "req-9"), (2, 4, "req-9")]


def test_sweep_removes_only_files_of_dead_processes(tmp_path):
    import subprocess
    import sys

    from bulkhead.disagg.transfer.shm import sweep_stale_files

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    names = [f"bulkhead-kv-{dead_pid}-{'a' * 16}", f"bulkhead-kv-{os.getpid()}-{'b' * 16}", "unrelated-file"]
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    assert sweep_stale_files(str(tmp_path)) == [str(tmp_path / names[0])]
    assert sorted(os.listdir(tmp_path)) == sorted(names[1:])


def test_tcp_a_receiver_restarted_on_the_same_port_gets_a_fresh_connection():
    # A decode worker restarted with a fixed --transfer-port: the writer's
    # pooled connection went to the old process; the new one's token differs,
    # so the writer connects again instead of writing into a dead socket
    # (found by tests/disagg/test_multihost.py: a BrokenPipe and a 500).
    source = make_source("tcp", timeout_s=5)
    first = make_target("tcp", LAYOUT, 8)
    port = first.descriptor()["port"]
    src = _src()
    source.write_pages(first.descriptor(), "r1", src, [0], [1], [1])
    first.close()
    second = make_target("tcp", LAYOUT, 8, port=port)
    try:
        source.write_pages(second.descriptor(), "r2", src, [2], [3], [1])
        assert torch.equal(second.pool.data[3], src.data[2])
    finally:
        second.close()
        source.close()
