
from pathlib import Path

import pytest
import torch

from bulkhead.kv.layout import KVLayout, parse_memory
from bulkhead.kv import huge_pages
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


def _vm_flags(address: int) -> set[str]:
    """The VmFlags of this process's mapping that holds address (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not Path("/sys/kernel/mm/transparent_hugepage/enabled").exists(),
                    reason="this kernel has no transparent huge pages")
def test_private_pool_is_advised_for_huge_pages_and_aligned():
    # 4 MiB: at least one whole huge page. "hg" is MADV_HUGEPAGE's flag.
    layout = KVLayout(num_layers=2, num_kv_heads=2, head_dim=64, page_size=16, dtype="float32")
    pool = KVPool(layout, 256, "zero")
    assert pool.data.data_ptr() % huge_pages.HUGE_PAGE == 0
    assert "hg" in _vm_flags(pool.data.data_ptr())
    assert not pool.data.any()  # zeroed, as torch.zeros was
    k, _ = pool.layer_views()[1]
    k[3].fill_(1.0)
    assert pool.data[3, 1, 0].eq(1.0).all() and pool.data[3, 1, 1].eq(0).all()


def test_advise_refusal_is_harmless():
    class Refusing:
        def madvise(self, *_):
            raise OSError(22, "Invalid argument")

    assert huge_pages.advise(Refusing()) is False
