"""KV cache geometry and the pool size a memory budget buys. Pure Python."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# How K is laid out inside a page (bulkhead.kv.pool.KVPool); workers whose
# pages differ here cannot exchange KV, so /server_info shows it and the
# router's pairing gate compares it.
K_PAGE_ORDER = "kv_heads,head_dim,positions"
# How pages sit in the pool: each page holds every layer's K and V in one
# range (pages outermost). Compared by the pairing gate like K_PAGE_ORDER.
POOL_ORDER = "pages,layers,kv,page"


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int  # tokens per page
    dtype: str  # "float32" | "bfloat16" | "float16"

    def __post_init__(self) -> None:
        if self.page_size <= 0:
            raise ValueError(f"page_size must be positive, got {self.page_size}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"kv dtype {self.dtype!r} is not one of {sorted(DTYPE_BYTES)}")

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]

    @property
    def bytes_per_page(self) -> int:
        return self.bytes_per_token * self.page_size

    def pages_for_tokens(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    def pages_for_budget(self, budget_bytes: int) -> int:
        return budget_bytes // self.bytes_per_page


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def parse_memory(text: str) -> int:
    """'2GiB', '512MB', '1073741824' -> bytes; a fraction in (0, 1] -> that share of available RAM."""
    s = str(text).strip().lower()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", s)
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"cannot read memory size {text!r}: use e.g. 2GiB, 512MB or a fraction like 0.25")
    value, unit = float(m.group(1)), m.group(2)
    if unit == "" and 0 < value <= 1 and "." in s:
        return int(value * available_memory_bytes())
    return int(value * _UNITS[unit])
