"""What a process holds resident, for /server_info's `memory` section, and
handing freed heap back to the operating system. Torch-free: the router
reports its own with it. The section: `rss_bytes` (VmRSS) by process
("router", each worker by name, or "colocated"), `kv_pool_bytes` by worker
(part of its RSS once its pages are touched), `rss_beyond_kv_pools_bytes`
(the sums' difference; docs/operations.md accounts for it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re


def rss_bytes(pid: int | str = "self") -> int:
    """VmRSS of a process (this one by default), bytes; 0 where /proc has none."""
    try:
        with open(f"/proc/{pid}/status") as f:
            match = re.search(r"^VmRSS:\s+(\d+)\s+kB", f.read(), re.M)
    except OSError:
        return 0
    return int(match.group(1)) * 1024 if match else 0


def release_freed_heap() -> bool:
    """Give the heap's free pages back to the OS (glibc's malloc_trim): the
    fp32 weights and the packing's temporaries, freed once the weights are
    laid out, otherwise stay resident in the allocator's free lists (measured:
    ~170 MB a worker). False where the C library has no malloc_trim."""
    try:  # CDLL(None), where no libc is found by name, is the process's own symbols
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


def section(rss: dict[str, int], pools: dict[str, int]) -> dict:
    """/server_info's `memory` body from each process's RSS and each worker's pool."""
    return {"rss_bytes": rss, "kv_pool_bytes": pools,
            "rss_beyond_kv_pools_bytes": sum(rss.values()) - sum(pools.values())}
