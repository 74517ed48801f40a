import pytest
import torch
import xxhash

from bulkhead.disagg.transfer import page_digest, page_digests
from bulkhead.kv.layout import KVLayout
from bulkhead.kv.pool import KVPool


def _pool(dtype="float32", num_pages=70):
    pool = KVPool(KVLayout(num_layers=3, num_kv_heads=2, head_dim=4, page_size=2, dtype=dtype), num_pages)
    pool.data.copy_(torch.randn(pool.data.shape, generator=torch.Generator().manual_seed(0)))
    return pool


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_digest_is_xxh3_of_the_page_layer_by_layer_k_then_v(dtype):
    pool = _pool(dtype)
    page = pool.page_bytes(5).contiguous()  # [L, 2, ps, H, D]
    assert page_digest(pool, 5) == xxhash.xxh3_64_intdigest(page.view(torch.uint8).numpy().tobytes())


def test_digests_follow_the_order_given_across_gather_chunks():
    pool = _pool()
    pages = list(range(69, -1, -1))  # more than one gather chunk
    assert page_digests(pool, pages) == [page_digest(pool, p) for p in pages]
    assert page_digests(pool, []) == []


def test_one_changed_value_changes_only_that_pages_digest():
    pool = _pool()
    before = page_digests(pool, list(range(pool.num_pages)))
    pool.data[9, 2, 1, 1, 0, 3] += 1.0  # page 9, layer 2, V
    after = page_digests(pool, list(range(pool.num_pages)))
    assert [p for p in range(pool.num_pages) if before[p] != after[p]] == [9]
