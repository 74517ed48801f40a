"""What bench/peers.py prints and writes: a table per concurrency with every
figure also as a ratio to bulkhead colocated's, the guard cost, the raw JSON
and a throughput-vs-concurrency PNG.

levels: {system: {concurrency: summary}}, a summary as workload.summarise()
returns it plus peak_rss_mib. A summary with `invalid` (some request did not
produce the tokens asked for) shows its reason in place of figures, and
takes part in no ratio, best-of or guard cost.
"""

from __future__ import annotations

import json
from pathlib import Path

BASELINE = "bulkhead"
# Systems that are bulkhead itself; every other is a peer.
OURS_PREFIX = "bulkhead"

# (summary key, column title, format of the figure)
COLUMNS = (
    ("tok_s", "out tok/s", lambda v: f"{v:.1f}"),
    ("ttft_median_s", "TTFT p50", lambda v: f"{v:.2f}s"),
    ("ttft_p99_s", "TTFT p99", lambda v: f"{v:.2f}s"),
    ("tpot_median_s", "TPOT p50", lambda v: f"{v * 1000:.0f}ms"),
    ("peak_rss_mib", "peak RSS", lambda v: f"{v:.0f}MiB"),
)


def ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}x"


def valid(row: dict | None) -> dict | None:
    return row if row is not None and not row.get("invalid") else None


def level_table(levels: dict[str, dict[int, dict]], concurrency: int) -> list[str]:
    base = valid(levels.get(BASELINE, {}).get(concurrency)) or {}
    head = f"{'system':<24}" + "".join(f"{title:>20}" for _, title, _ in COLUMNS)
    lines = [f"concurrency {concurrency}: figure (ratio to {BASELINE} colocated, same run)", head]
    for system, by_c in levels.items():
        row = by_c.get(concurrency)
        if row is None:
            continue
        if row.get("invalid"):
            lines.append(f"{system:<24}INVALID, not a figure: {row['invalid']}")
            continue
        cells = []
        for key, _, fmt in COLUMNS:
            value = row.get(key)
            cells.append("-" if value is None else f"{fmt(value)} ({ratio(value, base.get(key))})")
        lines.append(f"{system:<24}" + "".join(f"{c:>20}" for c in cells))
    return lines


def best_of(variants: dict[str, dict[int, dict]]) -> dict[int, dict]:
    """One peer measured in several configurations: at each concurrency, the
    valid figure with the most output tok/s, naming its configuration
    (`variant`). A concurrency where no configuration was valid keeps the
    first one's invalid summary."""
    best: dict[int, dict] = {}
    for variant, by_c in variants.items():
        for c, row in by_c.items():
            here = best.get(c)
            if valid(row) and (valid(here) is None or row["tok_s"] > here["tok_s"]):
                best[c] = {**row, "variant": variant}
            elif here is None:
                best[c] = {**row, "variant": variant}
    return dict(sorted(best.items()))


def best_peer(levels: dict[str, dict[int, dict]], concurrency: int) -> tuple[str, dict] | None:
    """The peer (any system not bulkhead's own) with the most valid output tok/s at this concurrency."""
    rows = [(system, row) for system, by_c in levels.items() if not system.startswith(OURS_PREFIX)
            and (row := valid(by_c.get(concurrency)))]
    return max(rows, key=lambda sr: sr[1]["tok_s"]) if rows else None


def headline(levels: dict[str, dict[int, dict]]) -> list[str]:
    """bulkhead colocated against the best valid peer at each concurrency: the comparison to quote."""
    lines = []
    for c in sorted({c for by_c in levels.values() for c in by_c}):
        ours, peer = valid(levels.get(BASELINE, {}).get(c)), best_peer(levels, c)
        if ours is None or peer is None:
            continue
        name, row = peer
        lines.append(f"c={c}: {BASELINE} {ours['tok_s']:.1f} tok/s vs best peer {name} {row['tok_s']:.1f} "
                     f"({ours['tok_s'] / row['tok_s']:.2f}x); TTFT p99 {ours['ttft_p99_s']:.2f}s vs "
                     f"{row['ttft_p99_s']:.2f}s")
    return lines


def _highest_common(a: dict[int, dict], b: dict[int, dict]) -> int | None:
    common = sorted(c for c in set(a) & set(b) if valid(a[c]) and valid(b[c]))
    return common[-1] if common else None


def guard_cost(levels: dict[str, dict[int, dict]]) -> dict | None:
    """Guards on / off at the highest concurrency both were measured at."""
    on, off = levels.get(BASELINE, {}), levels.get("bulkhead-no-guards", {})
    if (c := _highest_common(on, off)) is None:
        return None
    return {"concurrency": c, "tok_s_on_over_off": on[c]["tok_s"] / off[c]["tok_s"],
            "tpot_on_over_off": on[c]["tpot_median_s"] / off[c]["tpot_median_s"]}


def lineage_cost(levels: dict[str, dict[int, dict]]) -> dict | None:
    """With the page-lineage log / without, at the highest concurrency both
    were measured at (issue 17: within 2% at 16 clients)."""
    with_log, without = levels.get("bulkhead-lineage", {}), levels.get(BASELINE, {})
    if (c := _highest_common(with_log, without)) is None:
        return None
    return {"concurrency": c, "tok_s_with_over_without": with_log[c]["tok_s"] / without[c]["tok_s"],
            "tpot_with_over_without": with_log[c]["tpot_median_s"] / without[c]["tpot_median_s"]}


def lineage_line(cost: dict | None) -> str:
    if cost is None:
        return "lineage log cost: not measured (needs bulkhead and bulkhead-lineage)"
    return (f"lineage log cost at c={cost['concurrency']}: with / without = "
            f"{cost['tok_s_with_over_without']:.3f}x output tok/s, {cost['tpot_with_over_without']:.3f}x median TPOT")


def guard_line(cost: dict | None) -> str:
    if cost is None:
        return "guard cost: not measured (needs bulkhead and bulkhead-no-guards)"
    return (f"guard cost at c={cost['concurrency']}: guards on / off = {cost['tok_s_on_over_off']:.2f}x output "
            f"tok/s, {cost['tpot_on_over_off']:.2f}x median TPOT")


def prefill_lines(prefill: dict[str, dict]) -> list[str]:
    if not prefill:
        return []
    base = prefill.get(BASELINE, {}).get("tok_s")
    lines = [f"prefill of one {next(iter(prefill.values()))['tokens']}-token prompt"]
    for system, r in prefill.items():
        lines.append(f"{system:<20}{r['tok_s']:>10.0f} tok/s ({ratio(r['tok_s'], base)})  {r['seconds']:.2f}s")
    return lines


def write_json(path: Path, results: dict) -> None:
    path.write_text(json.dumps(results, indent=1, default=str))


def draw_png(path: Path, levels: dict[str, dict[int, dict]]) -> str | None:
    """Throughput vs concurrency, one line per system. Returns why not, or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no PNG: matplotlib is not installed (pip install -e '.[bench]')"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for system, by_c in levels.items():
        cs = sorted(by_c)
        ax.plot(cs, [by_c[c]["tok_s"] for c in cs], marker="o", label=system)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({c for by_c in levels.values() for c in by_c}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("concurrent clients (closed loop)")
    ax.set_ylabel("output tokens / s")
    ax.set_title("Throughput vs concurrency (same run, same machine)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
