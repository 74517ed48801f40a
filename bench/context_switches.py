"""Context switches and CPU time of a server's processes over one load level.

    python bench/context_switches.py                    # bulkhead-disagg and bulkhead, 16 clients, 3 runs
    python bench/context_switches.py --systems bulkhead-disagg --concurrency 1 --runs 1

Why: on a 2-core machine a thread that wakes while a model pass runs takes
a core from one of the pass's OpenMP threads, and the pass waits for it at
the next barrier. The default deployment's gap to colocated came from such
wake-ups: a second OpenMP team that made every team's threads sleep at
their barriers, and ZeroMQ links that polled every 2 ms
(docs/performance.md). For each system, run after run with fresh servers,
this prints the level's output tok/s and, per process of the server (the
router and its workers, or the colocated server), the voluntary and
involuntary context switches and the CPU seconds of its threads over the
level: the peers workload (`bench/peers.py`), after its warm-up.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import peers  # noqa: E402
import systems  # noqa: E402
from proc_memory import descendants  # noqa: E402
from workload import run_level, summarise  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Counters:
    voluntary: int = 0  # the thread blocked (a futex, a poll, a lock)
    involuntary: int = 0  # the thread was taken off its core for another
    cpu_s: float = 0.0

    def __add__(self, other: Counters) -> Counters:
        return Counters(self.voluntary + other.voluntary, self.involuntary + other.involuntary,
                        self.cpu_s + other.cpu_s)

    def __sub__(self, other: Counters) -> Counters:
        return Counters(self.voluntary - other.voluntary, self.involuntary - other.involuntary,
                        self.cpu_s - other.cpu_s)


def thread_counters(pid: int) -> dict[int, Counters]:
    """Each live thread of pid, from /proc (Linux); threads gone meanwhile are skipped."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read().rsplit(")", 1)[1].split()  # comm may hold spaces
        except OSError:
            continue
        ticks = int(stat[11]) + int(stat[12])  # utime + stime
        out[int(tid)] = Counters(int(fields["voluntary_ctxt_switches"]), int(fields["nonvoluntary_ctxt_switches"]),
                                 ticks / CLOCK_TICKS)
    return out


def level_counters(before: dict[int, Counters], after: dict[int, Counters]) -> Counters:
    """What the threads did between the two readings (a thread born meanwhile counts from zero)."""
    total = Counters()
    for tid, now in after.items():
        total += now - before.get(tid, Counters())
    return total


def role(pid: int, root: int) -> str:
    """What the process is, from its command line (its pid where that is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = [a.decode(errors="replace") for a in f.read().split(b"\0")]
    except OSError:
        return str(pid)
    return role_of(args, pid == root)


def role_of(args: list[str], is_root: bool) -> str:
    """`--role local` names the router (the launcher); a worker's `--role` its role."""
    if "--role" in args[:-1]:
        given = args[args.index("--role") + 1]
        return "router" if is_root and given == "local" else given
    return "server"


def measure(system: str, h: peers.Harness, concurrency: int) -> str:
    with systems.bulkhead(system, h.settings, []) as running:
        pids = descendants(running.pid)
        roles = {pid: role(pid, running.pid) for pid in pids}
        prompts = h.prompts[concurrency]
        run_level(running.endpoint, prompts[: min(4, len(prompts))], min(4, concurrency), 8)  # warm every process
        before = {pid: thread_counters(pid) for pid in pids}
        level = run_level(running.endpoint, prompts, concurrency, h.args.output_tokens)
        after = {pid: thread_counters(pid) for pid in pids}
    summary = summarise(level["wall_s"], level["records"], h.args.output_tokens)
    figure = "INVALID" if summary.get("invalid") else f"{summary['tok_s']:.1f} tok/s"
    parts = []
    for pid in pids:
        c = level_counters(before[pid], after[pid])
        parts.append(f"{roles[pid]}: {c.voluntary} voluntary, {c.involuntary} involuntary, "
                     f"{c.cpu_s:.1f} s CPU")
    return f"{system:<16} c={concurrency:<3} {figure:>12} | " + " | ".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="bulkhead-disagg,bulkhead", help="comma list of bulkhead systems")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3, help="runs of every system, in turn, fresh servers each")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="the servers' logs go here")
    args = ap.parse_args(argv)
    names = [s for s in args.systems.split(",") if s]
    unknown = [s for s in names if s not in systems.BULKHEAD_FLAGS]
    if unknown:
        ap.error(f"not bulkhead systems: {', '.join(unknown)} (choose from {', '.join(systems.BULKHEAD_FLAGS)})")
    args.out.mkdir(parents=True, exist_ok=True)
    h = peers.Harness(peers.parse_args(["--systems", ",".join(names), "--concurrency", str(args.concurrency),
                                        "--out", str(args.out)]))
    for _ in range(args.runs):
        for system in names:
            print(measure(system, h, args.concurrency), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
