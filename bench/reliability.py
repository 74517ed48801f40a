"""`make reliability`: the soak, the fault matrix, the bad-input suites and the
timing side channel, in that order, summed up in one table.

    python bench/reliability.py                      # soak 90 s, side channel 60 + 12 guesses
    python bench/reliability.py --soak-duration 30 --cross 20

Writes bench/results/reliability.json. Exit 1 when any part failed or any
must-be-zero figure (canary hits, pages lost, steps failed closed, 5xx on
bad input) is not zero.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import side_channel, soak  # noqa: E402

FAULT_TESTS = "tests/faults"
BAD_INPUT_TESTS = ("tests/server/test_bad_input.py", "tests/server/test_schema_fuzz.py")
SCHEMATHESIS_LINE = re.compile(r"schemathesis: (\d+) cases, (\d+) 5xx")


def run_pytest(paths: list[str], junit: Path, log: Path) -> dict:
    """Run pytest on paths that exist; per-file counts from its junit xml, and its output."""
    present = [p for p in paths if (ROOT / p).exists()]
    if not present:
        return {"present": False}
    with open(log, "w") as out:
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                              f"--junitxml={junit}", *present], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    per_file: dict[str, dict[str, int]] = {}
    if junit.exists():
        for case in ET.parse(junit).iter("testcase"):
            name = _test_file(case.get("classname", ""))
            counts = per_file.setdefault(name, {"passed": 0, "failed": 0, "skipped": 0})
            outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                       else "skipped" if case.find("skipped") is not None else "passed")
            counts[outcome] += 1
    return {"present": True, "paths": present, "returncode": rc, "per_file": per_file, "output": log.read_text()}


def _test_file(classname: str) -> str:
    """junit names a test by module (tests.server.test_x) or class (tests.server.test_x.TestY)."""
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        path = "/".join(parts[:i]) + ".py"
        if (ROOT / path).exists():
            return path
    return classname


def totals(result: dict, prefix: str = "") -> dict[str, int]:
    out = {"passed": 0, "failed": 0, "skipped": 0}
    for name, counts in result.get("per_file", {}).items():
        if name.startswith(prefix):
            for k in out:
                out[k] += counts[k]
    return out


def summarize(soak_report: dict, faults: dict, bad: dict, side: dict) -> tuple[list[tuple[str, str]], list[str]]:
    rows, problems = [], []
    rows.append(("load held", f"{soak_report['requests_served']} requests served, {soak_report['tenants']} tenants, "
                              f"{soak_report['duration_s']:.0f} s, concurrency {soak_report['concurrency']}, "
                              f"RSS {soak_report['rss_growth']:+.1%}"))
    problems += soak_report["failures"]
    if soak_report["errors"]:
        problems.append(f"soak errors: {soak_report['errors']}")
    if faults["present"]:
        t = totals(faults)
        rows.append(("faults survived", f"{t['passed']}/{t['passed'] + t['failed']} scenarios"))
        if t["failed"] or faults["returncode"]:
            problems.append(f"fault matrix: {t['failed']} failed (pytest exit {faults['returncode']})")
    else:
        rows.append(("faults survived", f"not present ({FAULT_TESTS})"))
    if bad["present"]:
        hand = totals(bad, "tests/server/test_bad_input")
        fuzz = SCHEMATHESIS_LINE.search(bad["output"])
        cases, fivexx = (int(fuzz[1]), int(fuzz[2])) if fuzz else (None, None)
        fuzz_text = f"{cases} schemathesis cases" if fuzz else "schemathesis not present"
        rows.append(("bad inputs tried", f"{hand['passed'] + hand['failed']} hand-written + {fuzz_text}, "
                                         f"{fivexx if fivexx is not None else '-'} 5xx"))
        if bad["returncode"] or fivexx:
            problems.append(f"bad input: pytest exit {bad['returncode']}, {fivexx} 5xx")
    else:
        rows.append(("bad inputs tried", "not present (" + ", ".join(BAD_INPUT_TESTS) + ")"))
    rows.append(("leaks found", f"{len(soak_report['cross_tenant_hits'])} cross-tenant canary hits, "
                                f"{soak_report['steps_failed_closed']} steps failed closed on poisoned KV"))
    rows.append(("pages lost", f"{sum(soak_report['pages_leaked'].values())} after drain"))
    cross, within = side["cross"], side["within"]
    rows.append(("side-channel AUC", f"cross {cross['auc']:.2f} (N={cross['secrets']}+{cross['decoys']}, "
                                     f"chance SE {cross['null_standard_error']:.2f}) / within {within['auc']:.2f} "
                                     f"(N={within['secrets']}+{within['decoys']})"))
    if cross["auc"] > side_channel.CROSS_TARGET or within["auc"] < 0.9:
        problems.append(f"side channel: cross {cross['auc']:.2f}, within {within['auc']:.2f}")
    return rows, problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--soak-duration", type=float, default=90.0)
    ap.add_argument("--cross", type=int, default=60, help="side channel: cross-tenant guesses (and as many decoys)")
    ap.add_argument("--within", type=int, default=12, help="side channel: within-tenant guesses (and decoys)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    print("== soak", flush=True)
    soak.main(["--duration", str(args.soak_duration), "--json", str(out / "reliability-soak.json"),
               "--out", str(out)])
    soak_report = json.loads((out / "reliability-soak.json").read_text())
    print("== fault matrix", flush=True)
    faults = run_pytest([FAULT_TESTS], out / "reliability-faults.xml", out / "reliability-faults.log")
    print("== bad input", flush=True)
    bad = run_pytest(list(BAD_INPUT_TESTS), out / "reliability-bad-input.xml", out / "reliability-bad-input.log")
    print("== side channel", flush=True)
    side_channel.main(["--cross", str(args.cross), "--within", str(args.within),
                       "--json", str(out / "reliability-side-channel.json"), "--out", str(out)])
    side = json.loads((out / "reliability-side-channel.json").read_text())

    rows, problems = summarize(soak_report, faults, bad, side)
    width = max(len(k) for k, _ in rows)
    print("\nbulkhead reliability")
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print("  " + ("PASS" if not problems else "FAIL: " + "; ".join(problems)))
    for part in (faults, bad):
        part.pop("output", None)  # the full logs sit next to the json
    (out / "reliability.json").write_text(json.dumps(
        {"table": dict(rows), "problems": problems, "soak": soak_report, "faults": faults, "bad_input": bad,
         "side_channel": {k: side[k] for k in ("prefix_tokens", "cross", "within")}}, indent=2))
    print(f"  results: {out / 'reliability.json'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
