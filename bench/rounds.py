"""The same comparison several times over, order alternating: a ratio this
machine's drift cannot fake.

    python bench/rounds.py --systems bulkhead,bulkhead-disagg --concurrency 16 --rounds 3
    python bench/rounds.py --systems bulkhead,bulkhead-no-guards --concurrency 16 --rounds 4

Why: one bench/peers.py run measures its systems one after the other, and
on this shared machine the same code served 72.5 and 103.8 tok/s at one
client in two runs 25 minutes apart (docs/performance.md). A 5-20% effect
is inside that swing, even as a ratio within one run, because the systems
of a run do not share a minute. Here each round is one bench/peers.py run
of every system named; the second, fourth, ... run them in the reverse
order, so a drift over the run favours neither side. Reported per system and
concurrency: the median output tok/s and its range over the rounds, and
the median and range of the round-by-round ratios to the first system
named (each ratio from one round, its two figures minutes apart), with the
p99 time to first token's the same way. A peer measured in several settings
(vLLM's `vllm[cores,malloc]`) gets a row per setting too. A level with any
request that did not produce its tokens in any round is INVALID, not a
figure. The load average (1, 5, 15 min) before and after each round is
printed and kept: how busy the machine was while it ran. Each round's
results and server logs stay in `--out` (bench/results/rounds-<commit>/
round<N>), the aggregate beside them in rounds.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import stopping  # noqa: E402
from bench.peers import commit_label  # noqa: E402

OWN_FLAGS = ("--systems", "--concurrency", "--out")  # set per round here, never passed through


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", required=True, help="comma list, as bench/peers.py takes it; the first is the base")
    ap.add_argument("--concurrency", default="16", help="comma list (default 16)")
    ap.add_argument("--rounds", type=int, default=3, help="bench/peers.py runs (default 3)")
    ap.add_argument("--out", type=Path, default=None,
                    help="where each round's results go (default bench/results/rounds-<commit>)")
    ap.add_argument("peers_args", nargs=argparse.REMAINDER,
                    help="after --: more bench/peers.py flags, the same in every round")
    args = ap.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    if len(args.systems) < 2 or args.rounds < 1:
        ap.error("name at least two systems and one round")
    if args.peers_args[:1] == ["--"]:
        args.peers_args = args.peers_args[1:]
    clash = [a for a in args.peers_args if a.split("=")[0] in OWN_FLAGS]
    if clash:
        ap.error(f"{', '.join(clash)}: set by this script for every round, not passed through")
    return args


def round_order(systems: list[str], i: int) -> list[str]:
    """The order of round i, counted from 0: as named, reversed every other round."""
    return systems if i % 2 == 0 else systems[::-1]


def with_settings(systems: list[str], rounds: list[dict]) -> list[str]:
    """The systems named, each followed by its settings (`name[...]`) measured in every round."""
    out = []
    for system in systems:
        out.append(system)
        found = [k for k in (rounds[0] if rounds else {}) if k.startswith(system + "[")]
        out += [k for k in found if all(k in levels for levels in rounds)]
    return out


def load_line(i: int, before: tuple, after: tuple) -> str:
    fmt = lambda t: "/".join(f"{v:.2f}" for v in t)  # noqa: E731
    return f"round {i + 1}: load average (1/5/15 min) before {fmt(before)}, after {fmt(after)}"


def summary(levels: dict, system: str, c: int) -> dict | None:
    """One system's summary at concurrency c in a run's levels (read back from
    JSON, its keys are strings)."""
    by_c = levels.get(system, {})
    return by_c.get(c) or by_c.get(str(c))


def spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def aggregate(rounds: list[dict], systems: list[str], concurrency: list[int]) -> dict:
    """rounds: each run's `levels` ({system: {concurrency: summary}}, JSON
    keys as strings or ints). Returns {system: {c: row}}, a row either
    {"invalid": why} or medians and ranges of tok_s, ratio and p99 ratio."""
    base, out = systems[0], {}
    for system in systems:
        for c in concurrency:
            rows = [summary(levels, system, c) for levels in rounds]
            bases = [summary(levels, base, c) for levels in rounds]
            bad = next((f"round {i + 1}: {r['invalid'] if r else 'not measured'}" for i, r in enumerate(rows)
                        if not r or r.get("invalid")), None)
            bad = bad or next((f"{base} in round {i + 1}: {r['invalid'] if r else 'not measured'}"
                               for i, r in enumerate(bases) if not r or r.get("invalid")), None)
            if bad is not None:
                out.setdefault(system, {})[c] = {"invalid": bad}
                continue
            out.setdefault(system, {})[c] = {
                "rounds": len(rows),
                "tok_s": spread([r["tok_s"] for r in rows]),
                "ratio": spread([r["tok_s"] / b["tok_s"] for r, b in zip(rows, bases)]),
                "p99_ratio": spread([r["ttft_p99_s"] / b["ttft_p99_s"] for r, b in zip(rows, bases)]),
            }
    return out


def table(agg: dict, base: str) -> list[str]:
    lines = [f"{'system':<28}{'c':>4}{'out tok/s (range)':>26}{f'/ {base} (range)':>30}{'p99 TTFT ratio':>26}"]
    for system, by_c in agg.items():
        for c, row in by_c.items():
            if "invalid" in row:
                lines.append(f"{system:<28}{c:>4}  INVALID, not a figure: {row['invalid']}")
                continue
            fmt = lambda t, f: f"{f(t[0])} ({f(t[1])}-{f(t[2])})"  # noqa: E731
            lines.append(f"{system:<28}{c:>4}{fmt(row['tok_s'], lambda v: f'{v:.1f}'):>26}"
                         f"{fmt(row['ratio'], lambda v: f'{v:.2f}x'):>30}"
                         f"{fmt(row['p99_ratio'], lambda v: f'{v:.2f}x'):>26}")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    stopping.exit_on_sigterm()
    concurrency = [int(c) for c in args.concurrency.split(",") if c]
    top = args.out or ROOT / "bench" / "results" / f"rounds-{commit_label()}"
    rounds, loads, failed = [], [], False
    for i in range(args.rounds):
        out = top / f"round{i + 1}"
        order = round_order(args.systems, i)
        print(f"round {i + 1} of {args.rounds}: {', '.join(order)}", flush=True)
        before = os.getloadavg()
        # Stopped meanwhile, the round's bench/peers.py is asked to stop its servers (stopping.run_child).
        returncode = stopping.run_child([sys.executable, str(ROOT / "bench" / "peers.py"), "--systems",
                                         ",".join(order), "--concurrency", args.concurrency, "--out", str(out),
                                         *args.peers_args])
        failed |= returncode != 0
        loads.append({"round": i + 1, "order": order, "load_before": before, "load_after": os.getloadavg()})
        print(load_line(i, before, loads[-1]["load_after"]), flush=True)
        found = sorted(out.glob("peers-*.json"), key=lambda p: p.stat().st_mtime)
        if not found:
            print(f"round {i + 1}: bench/peers.py wrote no results (exit {returncode})", flush=True)
            return 1
        rounds.append(json.loads(found[-1].read_text())["levels"])
    agg = aggregate(rounds, with_settings(args.systems, rounds), concurrency)
    (top / "rounds.json").write_text(json.dumps({"systems": args.systems, "rounds": args.rounds, "load": loads,
                                                 "levels": agg}, indent=1))
    print()
    for load in loads:
        print(load_line(load["round"] - 1, load["load_before"], load["load_after"]))
    for line in table(agg, args.systems[0]):
        print(line)
    print(f"each round's results: {top}/round<N>; the aggregate: {top / 'rounds.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
