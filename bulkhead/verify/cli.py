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
from bulkhead.verify.actors.config import Guards, Variant
from bulkhead.verify.checker import Result, Violation, explore
from bulkhead.verify.coverage import format_coverage, handler_coverage, summary
from bulkhead.verify.scenarios import LEGACY_GOALS, legacy_search
from bulkhead.verify.world import WORLDS, drain_world


def add_subcommand(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("verify", help="model-check the KV transfer protocol",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--protocol", choices=("real", "legacy"), default="real")
    parser.add_argument("--bound", choices=sorted(WORLDS), default="default",
                        help="world size for the real protocol (legacy searches use their own)")
    parser.add_argument("--stats", action="store_true", help="print a table of the searches")
    parser.add_argument("--no-liveness", action="store_true", help="skip the liveness check")
    parser.add_argument("--coverage", action="store_true",
                        help="list the runtime's handlers: which the search covered, and the model-only steps")
    parser.add_argument("--simulate", action="store_true",
                        help="run the deterministic simulation of the running system (bulkhead/sim)")
    from bulkhead.sim.cli import add_arguments as add_sim_arguments

    add_sim_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.simulate:
        from bulkhead.sim.cli import run as simulate

        return simulate(args)
    if args.protocol == "real":
        world = WORLDS[args.bound]()
        transitions.calls.clear()
        rows = []
        for name, w in (("real", world), ("real:drain", drain_world())):
            result = explore(w, w.protocol(Guards(), Variant.REAL), liveness=not args.no_liveness)
            rows.append((name, result))
            _report_real(result)
        coverage = handler_coverage(transitions.explored())
        print(format_coverage(coverage) if args.coverage else summary(coverage))
        ok = all(result.ok for _, result in rows)
    else:
        rows, ok = [], True
        for name in LEGACY_GOALS:
            result = legacy_search(name)
            rows.append((f"legacy:{name}", result))
            found = result.found()
            ok = ok and found is not None
            print(f"== legacy, {name}: " + (format_trace(found) if found else "NOT FOUND"))
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


def format_stats(rows) -> str:
    header = ("protocol", "bounds", "states", "transitions", "seconds", "result")
    table = [header]
    for name, result in rows:
        world = result.world
        bounds = f"{world.name}: {len(world.requests)} req, faults {world.faults}" + \
            (f", drains {world.drains}" if world.drains else "")
        if name.startswith("real"):
            verdict = "0 violations" if result.ok else f"{len(result.violations)} kinds violated"
            if result.liveness_checked and result.stuck_states:
                verdict += f", {result.stuck_states} stuck"
        else:
            found = result.found()
            verdict = f"{found.kind} in {len(found.labels)} steps" if found else "not found"
        table.append((name, bounds, str(result.states), str(result.transitions),
                      f"{result.seconds:.1f}", verdict))
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bulkhead verify", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(parser)
    return run(parser.parse_args(argv))
