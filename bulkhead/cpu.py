"""What this CPU can run, read once from /proc/cpuinfo: the model's kernel
table (bulkhead.model.kernel_table) and the adapters' C delta
(bulkhead.lora.products) choose by it, so it lies below both."""

from __future__ import annotations

import functools

CPU_FEATURES = ("avx512_bf16", "avx512_vnni", "avx512f", "avx2")


@functools.cache
def cpu_features(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The features of CPU_FEATURES that /proc/cpuinfo's flags name; none
    where it cannot be read (another OS): the exact path then."""
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return frozenset()
    return frozenset(CPU_FEATURES) & frozenset(flags)
