"""What bench/peers.py prints and writes: a table per concurrency with every
figure also as a ratio to bulkhead colocated's, the guard cost, the raw JSON
and a throughput-vs-concurrency PNG.

levels: {system: {concurrency: summary}}, a summary as workload.summarise()
returns it plus peak_rss_mib.
"""

from __future__ import annotations

import json
from pathlib import Path

BASELINE = "bulkhead"

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


def level_table(levels: dict[str, dict[int, dict]], concurrency: int) -> list[str]:
    base = levels.get(BASELINE, {}).get(concurrency, {})
    head = f"{'system':<20}" + "".join(f"{title:>20}" for _, title, _ in COLUMNS)
    lines = [f"concurrency {concurrency}: figure (ratio to {BASELINE} colocated, same run)", head]
    for system, by_c in levels.items():
        row = by_c.get(concurrency)
        if row is None:
            continue
        cells = []
        for key, _, fmt in COLUMNS:
            value = row.get(key)
            cells.append("-" if value is None else f"{fmt(value)} ({ratio(value, base.get(key))})")
        lines.append(f"{system:<20}" + "".join(f"{c:>20}" for c in cells))
    return lines


def guard_cost(levels: dict[str, dict[int, dict]]) -> dict | None:
    """Guards on / off at the highest concurrency both were measured at."""
    on, off = levels.get(BASELINE, {}), levels.get("bulkhead-no-guards", {})
    common = sorted(set(on) & set(off))
    if not common:
        return None
    c = common[-1]
    return {"concurrency": c, "tok_s_on_over_off": on[c]["tok_s"] / off[c]["tok_s"],
            "tpot_on_over_off": on[c]["tpot_median_s"] / off[c]["tpot_median_s"]}


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
