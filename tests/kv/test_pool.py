
import pytest
import torch

from bulkhead.kv.layout import KVLayout, parse_memory
from bulkhead.kv.pool import KVPool

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=4, page_size=4, dtype="float32")


def test_zero_scrub_erases_only_the_named_pages():
    pool = KVPool(LAYOUT, 4, "zero")
    pool.data.fill_(7.0)
    pool.scrub([1, 3])
    assert torch.all(pool.page_bytes(1) == 0) and torch.all(pool.page_bytes(3) == 0)
    assert torch.all(pool.page_bytes(0) == 7.0) and torch.all(pool.page_bytes(2) == 7.0)
    assert pool.pages_scrubbed == 2


def test_poison_scrub_fills_nan_and_pool_starts_poisoned():
    pool = KVPool(LAYOUT, 3, "poison")
    assert torch.isnan(pool.data).all()
    pool.data.fill_(1.0)
    pool.scrub([2])
    assert torch.isnan(pool.page_bytes(2)).all()
    assert not torch.isnan(pool.page_bytes(0)).any()


def test_layer_views_share_the_pool_storage():
    pool = KVPool(LAYOUT, 3, "zero")
    k, v = pool.layer_views()[1]
    k[2].fill_(5.0)
    v[1].fill_(7.0)
    assert torch.all(pool.data[2, 1, 0] == 5.0) and torch.all(pool.data[1, 1, 1] == 7.0)
    assert not pool.data[0].any() and not pool.data[2, 0].any()  # other pages and layers untouched
    assert k.shape == (3, 2, 4, 4)  # [pages, kv heads, head dim, positions]
    assert v.shape == (3, 4, 2, 4)  # [pages, positions, kv heads, head dim]


def test_layout_sizes():
    assert LAYOUT.bytes_per_token == 2 * 2 * 2 * 4 * 4
    assert LAYOUT.bytes_per_page == LAYOUT.bytes_per_token * 4
    assert LAYOUT.pages_for_tokens(9) == 3
    assert LAYOUT.pages_for_budget(LAYOUT.bytes_per_page * 5 + 1) == 5


def test_unknown_scrub_mode_is_refused():
    with pytest.raises(ValueError):
        KVPool(LAYOUT, 1, "none")


@pytest.mark.parametrize("text,expected", [("2GiB", 2 * 2**30), ("512MB", 512 * 10**6), ("1024", 1024),
                                           ("1.5KiB", 1536)])
def test_parse_memory(text, expected):
    assert parse_memory(text) == expected


def test_parse_memory_fraction_of_available():
    assert 0 < parse_memory("0.01") < parse_memory("0.02")


def test_parse_memory_rejects_garbage():
    with pytest.raises(ValueError, match="cannot read"):
        parse_memory("lots")
