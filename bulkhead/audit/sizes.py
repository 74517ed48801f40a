"""Parse memory sizes the way operators write them: `141GiB`, `80GB`, `1234`.

Decimal units (kB, MB, GB, TB) are powers of 1000 and binary units (KiB,
MiB, GiB, TiB) powers of 1024, because accelerator vendors quote HBM in one
and frameworks report it in the other; mixing them up is a 7% error at GiB
scale, which is bigger than most activation reserves.
"""

from __future__ import annotations

import re
from decimal import Decimal

from bulkhead.audit.errors import MemorySizeError

_UNIT_BYTES = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
               "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}

_SIZE = re.compile(r"^\s*([0-9][0-9_,]*(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_memory_size(text: str, unit_required: bool = False, what: str = "memory size") -> int:
    """Bytes in `text`; fractional results round down to whole bytes.

    unit_required: a bare number is an error, not bytes. `--accelerator-memory
    80` means 80 GB to anyone who writes it, and read as 80 bytes it made a
    budget of -16.9 GiB; `80B` still says bytes when bytes are meant.
    what: the flag the text came from, named in the error."""
    match = _SIZE.match(str(text))
    if match is None:
        raise MemorySizeError(text, "expected a number with an optional unit, e.g. 141GiB, 80GB or 1234", what)
    number, unit = match.groups()
    if unit_required and not unit:
        raise MemorySizeError(text, f"a number without a unit; give one, e.g. {number.strip()}GiB or "
                                    f"{number.strip()}GB (or {number.strip()}B for bytes)", what)
    multiplier = _UNIT_BYTES.get(unit.lower())
    if multiplier is None:
        known = ", ".join(u for u in _UNIT_BYTES if u) + " (any case)"
        raise MemorySizeError(text, f"unknown unit {unit!r}; known units: {known}", what)
    return int(Decimal(number.replace("_", "").replace(",", "")) * multiplier)  # the regex admits only digits


def format_bytes(n: int) -> str:
    """`n` in GiB with two decimals, the unit accelerator memory is budgeted in."""
    return f"{n / 1024**3:,.2f} GiB"
