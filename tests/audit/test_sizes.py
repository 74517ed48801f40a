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


@pytest.mark.parametrize("text", ["80", "80.5", " 141 ", "80_000"])
def test_a_bare_number_is_refused_where_a_unit_is_required(text):
    assert parse_memory_size(text) > 0  # bytes, where bytes are the flag's unit
    with pytest.raises(MemorySizeError) as raised:
        parse_memory_size(text, unit_required=True, what="--accelerator-memory")
    message = str(raised.value)
    assert message.startswith(f"--accelerator-memory {text!r}: a number without a unit; give one")
    assert "GiB" in message and "GB" in message
    assert parse_memory_size(text.strip() + "B", unit_required=True) == parse_memory_size(text)
