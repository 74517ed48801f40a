"""Pages move off the engine thread without starting an OpenMP team
(bulkhead/disagg/transfer/page_copy.py says why)."""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from bulkhead.disagg.transfer import make_source, make_target
from bulkhead.disagg.transfer.page_copy import copy_pages, gather_pages
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.pool import KVPool
from bulkhead.model.decode_kernel import torch_uses_libgomp

# SmolLM2's page: 184,320 bf16 elements, far past the size at which torch
# splits a copy over its threads.
LAYOUT = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, page_size=16, dtype="bfloat16")


def _pool(num_pages=6, seed=0):
    pool = KVPool(LAYOUT, num_pages)
    pool.data.copy_(torch.randn(pool.data.shape, generator=torch.Generator().manual_seed(seed)))
    return pool


def test_copy_and_gather_move_whole_pages_byte_for_byte():
    src, dst = _pool(seed=1), _pool(seed=2)
    copy_pages(src.data, [1, 3], dst.data, [5, 0])
    assert torch.equal(dst.data[5], src.data[1]) and torch.equal(dst.data[0], src.data[3])
    assert torch.equal(dst.data[2], _pool(seed=2).data[2])  # pages not named are untouched
    got = gather_pages(src.data, [4, 1])
    assert got.tobytes() == src.data[[4, 1]].view(torch.uint8).numpy().tobytes()


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not torch_uses_libgomp(), reason="torch here does not run on libgomp")
@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="no /proc")
@pytest.mark.parametrize("backend, receiver_threads", [("shm", 0), ("tcp", 1)])
def test_a_write_from_a_transfer_thread_starts_no_openmp_team(backend, receiver_threads):
    # A torch copy on the prefill worker's transfer thread (or the tcp
    # receiver's) started an OpenMP team of that thread's own; libgomp then
    # throttled every team's spinning and the engine's passes ran 1.25x
    # slower. The only threads a write may add are the receiver's own.
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    target, source = make_target(backend, LAYOUT, 8), make_source(backend)
    transfers = ThreadPoolExecutor(1)
    try:
        src = _pool()  # built first: torch ops on this thread must not move the count
        transfers.submit(lambda: None).result()  # the transfer thread exists before counting
        before = _threads()
        transfers.submit(source.write_pages, target.descriptor(), "r", src, [0, 1, 2, 3], [4, 5, 6, 7],
                         [1, 1, 1, 1]).result()
        assert _threads() - before == receiver_threads
        assert torch.equal(target.pool.data[4:8], src.data[0:4])
    finally:
        transfers.shutdown()
        source.close()
        target.close()
        torch.set_num_threads(previous)
