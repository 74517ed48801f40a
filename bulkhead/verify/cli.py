"""`bulkhead verify`: run the model checker.

    bulkhead verify                      real protocol, default bound: expect 0 violations
    bulkhead verify --protocol legacy    print the shortest cross-tenant reads
    bulkhead verify --bound large        larger world (minutes)
    bulkhead verify --stats              one table row per search
    bulkhead verify --coverage           which runtime handlers the search covered, and the
                                         steps only the model takes
    bulkhead verify --simulate --seeds 2000   the running system under the seeded
                                         simulator instead (same as `bulkhead sim`)

Exit status 0 means the expected result: no violation for `real`, the
incident reproduced for `legacy`.
"""
from __future__ import annotations

import argparse

from bulkhead.protocol import transitions
from bulkhead.sim.cli import add_arguments as add_sim_arguments
from bulkhead.verify.actors.config import Guards, Variant
from bulkhead.verify.checker import Result, Violation, explore
from bulkhead.verify.coverage import format_coverage, handler_coverage, summary
from bulkhead.verify.scenarios import LEGACY_GOALS, legacy_search
from bulkhead.verify.world import WORLDS, drain_world


def add_subcommand(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("verify", help="model-check the KV transfer protocol",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=("real", "legacy"), default="real")
    parser.add_argument("--bound", choices=sorted(WORLDS), default="default",
                        help="world size for the real protocol (legacy searches use their own)")
    parser.add_argument("--stats", action="store_true", help="print a table of the searches")
    parser.add_argument("--coverage", action="store_true",
                        help="list the runtime's handlers: which the search covered, and the model-only steps")
    parser.add_argument("--simulate", action="store_true",
                        help="run the deterministic simulation of the running system (bulkhead/sim)")
    add_sim_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    if args.simulate:
        from bulkhead.sim.cli import run as simulate

        return simulate(args)
    rows = []
    if args.protocol == "real":
        transitions.calls.clear()
        for name, world in (("real", WORLDS[args.bound]()), ("real:drain", drain_world())):
            result = explore(world, world.protocol(Guards(), Variant.REAL))
            rows.append((name, result))
            _report_real(result)
        coverage = handler_coverage(transitions.explored())
        print(format_coverage(coverage) if args.coverage else summary(coverage))
        ok = all(result.ok for _, result in rows)
    else:
        for name in LEGACY_GOALS:
            rows.append((f"legacy:{name}", legacy_search(name)))
            found = rows[-1][1].found()
            print(f"== legacy, {name}: " + (format_trace(found) if found else "NOT FOUND"))
        ok = all(result.found() is not None for _, result in rows)
    if args.stats:
        print(format_stats(rows))
    return 0 if ok else 1


def _report_real(result: Result) -> None:
    print(f"real protocol, {result.world.describe()}")
    print(f"{result.states} states, {result.transitions} transitions, {result.seconds:.1f} s")
    if result.ok:
        print("0 violations" + (", liveness holds" if result.liveness_checked else ""))
    for violation in result.violations.values():
        print("VIOLATION " + format_trace(violation))
    if result.stuck_example:
        print(f"LIVENESS: {result.stuck_states} stuck states; first: " + format_trace(result.stuck_example))


def format_trace(violation: Violation) -> str:
    lines = [f"{violation.kind}: {violation.detail} ({len(violation.labels)} steps)"]
    lines += [f"  {i:2d}. {label}" for i, label in enumerate(violation.labels, 1)]
    return "\n".join(lines)


def _verdict(name: str, result: Result) -> str:
    if not name.startswith("real"):
        found = result.found()
        return f"{found.kind} in {len(found.labels)} steps" if found else "not found"
    verdict = "0 violations" if result.ok else f"{len(result.violations)} kinds violated"
    return verdict + (f", {result.stuck_states} stuck" if result.liveness_checked and result.stuck_states else "")


def format_stats(rows) -> str:
    table = [("protocol", "bounds", "states", "transitions", "seconds", "result")]
    for name, result in rows:
        w = result.world
        bounds = f"{w.name}: {len(w.requests)} req, faults {w.faults}" + (f", drains {w.drains}" if w.drains else "")
        table.append((name, bounds, str(result.states), str(result.transitions), f"{result.seconds:.1f}",
                      _verdict(name, result)))
    widths = [max(map(len, column)) for column in zip(*table)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
