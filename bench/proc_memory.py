"""Resident memory of a process tree, sampled from /proc (Linux), and whether it stayed flat."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def descendants(root: int) -> list[int]:
    """root and every process below it (the router's prefill and decode workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                # pid (comm) state ppid ...; comm may hold spaces, so split after ')'.
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0  # exited between listing and reading


@dataclass
class MemoryTrace:
    root_pid: int
    samples: list[int] = field(default_factory=list)  # total RSS of the tree, bytes, one per sample

    def sample(self) -> int:
        total = sum(rss_bytes(p) for p in descendants(self.root_pid))
        self.samples.append(total)
        return total

    @property
    def peak(self) -> int:
        return max(self.samples, default=0)

    @property
    def growth(self) -> float:
        """Mean of the last third over the mean of the first third, minus 1."""
        third = len(self.samples) // 3
        if third == 0:
            return 0.0
        first = statistics.fmean(self.samples[:third])
        last = statistics.fmean(self.samples[-third:])
        return last / first - 1.0
