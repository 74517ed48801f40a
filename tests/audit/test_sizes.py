import pytest

from bulkhead.audit.errors import MemorySizeError
from bulkhead.audit.sizes import parse_memory_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("141GiB", 141 * 1024**3),  # 151,397,597,184: an H200 as frameworks count it
        ("80GB", 80_000_000_000),  # decimal, as vendors sell it
        ("80gb", 80_000_000_000),
        ("1.5TiB", 3 * 1024**4 // 2),
        ("512MiB", 512 * 1024**2),
        ("4KiB", 4096),
        ("123456789", 123_456_789),
        ("681_280", 681_280),
        ("2B", 2),
        (" 16 GiB ", 16 * 1024**3),
    ],
)
def test_memory_sizes_parse_to_bytes(text, expected):
    assert parse_memory_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "12 parsecs", "1.2.3GB", "0x10"])
def test_bad_memory_sizes_raise_a_typed_error_naming_the_input(text):
    with pytest.raises(MemorySizeError) as raised:
        parse_memory_size(text)
    assert repr(text) in str(raised.value)
