"""`bulkhead sim` (also `bulkhead verify --simulate`): run the deterministic simulation.

    bulkhead sim --seeds 2000            seeds 0..1999: fault counts, violations, findings
    bulkhead sim --seed 17               replay one seed and print its trace
    bulkhead sim --seeds 300 --no-write-guard
                                         ablation: decode's write guard is not asked
                                         (a one-sided backend); expect violations

Exit status 0: no violation, and (with --seeds) every fault kind fired.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from bulkhead.sim.faults import FAULT_KINDS

if TYPE_CHECKING:
    from bulkhead.sim.runner import Summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, default=None, help="run this many seeds (default 500)")
    parser.add_argument("--seed", type=int, default=None, help="replay one seed with its trace")
    parser.add_argument("--no-write-guard", action="store_true",
                        help="ablation: the simulated backend does not ask decode's write guard")


def add_subcommand(subparsers) -> None:
    parser = subparsers.add_parser("sim", help="deterministic simulation of router, prefill and decode",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # Imported here: the runner loads torch and the engine, which every other
    # `bulkhead` subcommand would otherwise wait for (bulkhead/cli.py).
    from bulkhead.sim.runner import quiet_runtime_logs, run_seed, run_seeds

    guard = not args.no_write_guard
    if args.seed is not None:
        with quiet_runtime_logs():
            result = run_seed(args.seed, honour_write_guard=guard, trace=True)
        print("\n".join(result.trace))
        print(f"seed {result.seed}: {result.plan}")
        print("faults fired: " + (", ".join(f"{k} {v}" for k, v in sorted(result.fired.items())) or "none"))
        for v in result.findings:
            print(f"FINDING {v}")
        print(f"{len(result.violations)} violations")
        return 1 if result.violations else 0
    count = args.seeds if args.seeds is not None else 500
    summary = run_seeds(range(count), honour_write_guard=guard)
    print(format_summary(summary))
    return 0 if summary.ok else 1


def format_summary(s: Summary) -> str:
    lines = [f"{s.seeds} seeds in {s.wall_s:.1f} s ({s.virtual_s:.0f} s of virtual time)"]
    lines.append("faults fired: " + ", ".join(f"{k} {s.fired[k]}" for k in FAULT_KINDS))
    outcomes = {k.removeprefix("outcome_"): v for k, v in sorted(s.stats.items()) if k.startswith("outcome_")}
    lines.append("client outcomes: " + ", ".join(f"{k} {v}" for k, v in outcomes.items()))
    others = {k: v for k, v in sorted(s.stats.items()) if not k.startswith("outcome_")}
    lines.append("also: " + ", ".join(f"{k} {v}" for k, v in others.items()))
    if s.never_fired:
        lines.append(f"FAIL: fault kinds that never fired: {', '.join(s.never_fired)}")
    if s.findings:
        lines.append(f"findings (liveness after a lost control message, nothing retransmits): "
                     f"{dict(s.findings)} in seeds {s.finding_seeds[:10]}")
    lines.append(f"{sum(s.violations.values())} violations" + (f": {dict(s.violations)}" if s.violations else ""))
    flag = "" if s.honour_write_guard else " --no-write-guard"
    for result in s.failing[:5]:
        lines.append(f"  seed {result.seed} ({result.plan}): {result.violations[0]}   "
                     f"replay: bulkhead sim --seed {result.seed}{flag}")
    return "\n".join(lines)

