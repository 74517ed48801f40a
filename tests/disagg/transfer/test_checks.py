"""Argument and geometry checks every backend runs before moving a byte, and the registry."""

import pytest
import torch

from bulkhead.disagg.transfer import BACKENDS, TransferError, make_source, make_target
from bulkhead.disagg.transfer.mooncake_backend import byte_ranges, page_runs
from bulkhead.disagg.transfer.base import check_geometry, check_page_lists


@pytest.mark.parametrize(
    "src, dst, gens, why",
    [
        ([0, 1], [0], [1], "must be equal"),
        ([0, 9], [0, 1], [1, 1], "out of range"),
        ([0, 1], [0, 10], [1, 1], "out of range"),
        ([0, 1], [3, 3], [1, 1], "named twice"),
    ],
)
def test_bad_page_lists_are_refused_before_any_byte_moves(src, dst, gens, why):
    with pytest.raises(TransferError, match=why) as e:
        check_page_lists(src, dst, gens, src_num_pages=8, dst_num_pages=10)
    assert e.value.drained


def test_geometry_must_match_except_page_count():
    src = torch.zeros(5, 2, 2, 4, 3, 8)  # [pages, layers, K/V, positions, kv heads, head dim]
    check_geometry(src, [99, 2, 2, 4, 3, 8], "float32")
    with pytest.raises(TransferError, match="page geometry"):
        check_geometry(src, [5, 2, 2, 4, 3, 16], "float32")
    with pytest.raises(TransferError, match="page geometry"):
        check_geometry(src, [5, 3, 2, 4, 3, 8], "float32")  # another layer count
    with pytest.raises(TransferError, match="bfloat16"):
        check_geometry(src, [5, 2, 2, 4, 3, 8], "bfloat16")


def test_unknown_backend_is_a_value_error():
    assert BACKENDS == ("shm", "tcp", "mooncake")
    with pytest.raises(ValueError, match="not one of"):
        make_source("rdma")
    with pytest.raises(ValueError, match="not one of"):
        make_target("carrier-pigeon", None, 1)


def test_runs_need_both_sides_consecutive():
    assert page_runs([0, 1, 2, 7, 8], [5, 6, 7, 3, 9]) == [(0, 5, 3), (7, 3, 1), (8, 9, 1)]
    assert page_runs([], []) == []


def test_byte_ranges_are_one_per_run_of_whole_pages():
    # 100-byte pages: source pages 1, 2 then 5; destination 6, 7 then 3
    bufs, peers, lens = byte_ranges([1, 2, 5], 1000, [6, 7, 3], 50_000, page_bytes=100)
    assert bufs == [1000 + 100, 1000 + 500]
    assert peers == [50_000 + 600, 50_000 + 300]
    assert lens == [200, 100]


def test_mooncake_refuses_to_start_where_it_would_listen_on_real_interfaces():
    from bulkhead.disagg.transfer.mooncake_backend import non_loopback_interfaces
    from bulkhead.kv.layout import KVLayout

    if not non_loopback_interfaces():
        pytest.skip("this network namespace has only loopback")
    layout = KVLayout(num_layers=1, num_kv_heads=1, head_dim=4, page_size=2, dtype="float32")
    with pytest.raises(TransferError, match="every interface"):
        make_target("mooncake", layout, 4)
    from bulkhead.kv.pool import KVPool

    pool = KVPool(layout, 4)
    desc = {"backend": "mooncake", "session": "127.0.0.1:1", "base": 0, "shape": [4, 1, 2, 2, 1, 4], "dtype": "float32"}
    with pytest.raises(TransferError, match="every interface"):
        make_source("mooncake").write_pages(desc, "r", pool, [0], [0], [1])

