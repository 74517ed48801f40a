"""/dashboard's plots: the last ten minutes, sampled on the server, so that a
page opened later still draws them. The sampler runs on the event loop, the
thread that answers /dashboard/data: a point reads exactly what a poll would,
with no lock of its own.

A point holds what the plots draw: rates where the figures are running
totals (a total that went down, a worker that restarted, counts as no
change), and the median and p99 time to first token over the last
TTFT_WINDOW_S from raw times (the Prometheus histogram's buckets are too
coarse for a p99 of a few dozen requests). Memory is bounded: SPAN_S /
PERIOD_S points, and at most MAX_TTFT_SAMPLES times.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

PERIOD_S = 2.0       # a plot moves every 2 s; the page polls every second
SPAN_S = 600.0       # ten minutes: 300 points
TTFT_WINDOW_S = 10.0  # wide enough that a few requests a minute still draw a line
MAX_TTFT_SAMPLES = 100_000
POOL_STATES = ("owned", "cached", "dirty", "free")


class FirstTokenTimes:
    """Times to first token of the last window_s seconds (added and read on the event loop)."""

    def __init__(self, window_s: float = TTFT_WINDOW_S, clock: Callable[[], float] = time.monotonic):
        self.window_s = window_s
        self.clock = clock
        self._times: deque[tuple[float, float]] = deque(maxlen=MAX_TTFT_SAMPLES)  # (when, seconds)

    def add(self, seconds: float) -> None:
        self._times.append((self.clock(), seconds))

    def quantiles(self) -> tuple[float | None, float | None]:
        """(median, p99) by nearest rank; (None, None) with no first token in the window."""
        cutoff = self.clock() - self.window_s
        while self._times and self._times[0][0] < cutoff:
            self._times.popleft()
        values = sorted(s for _, s in self._times)
        if not values:
            return None, None
        return _rank(values, 0.5), _rank(values, 0.99)


def _rank(values: list[float], q: float) -> float:
    return round(values[max(0, math.ceil(q * len(values)) - 1)], 4)


def _rates(now: dict[str, float], before: dict[str, float] | None, dt: float) -> dict[str, float]:
    if before is None or dt <= 0:
        return {}
    return {t: round(max(0.0, v - before.get(t, 0)) / dt, 2) for t, v in now.items()}


def make_point(view: dict, previous: dict | None, ttft: tuple[float | None, float | None]) -> dict:
    """One point from dashboard_view's figures; `previous` is the point
    before it (None for the first, which has no rates)."""
    totals = {"tokens": {t: r.get("output_tokens_served", 0) for t, r in view["tenants"].items()},
              "throttled": {t: r.get("throttled", 0) for t, r in view["tenants"].items()}}
    dt = view["time"] - previous["t"] if previous else 0.0
    return {
        "t": round(view["time"], 3),
        "pools": {p["name"]: {s: p[s] for s in POOL_STATES} | {"num_pages": p["num_pages"]} for p in view["pools"]},
        "tokens_per_s": _rates(totals["tokens"], previous and previous["totals"]["tokens"], dt),
        "throttled_per_s": _rates(totals["throttled"], previous and previous["totals"]["throttled"], dt),
        "transfers_in_flight": view["transfers_in_flight"],
        "ttft_p50": ttft[0], "ttft_p99": ttft[1],
        "totals": totals,  # the next point's rates start from these
    }


class DashboardHistory:
    def __init__(self, figures: Callable[[], dict], first_tokens: FirstTokenTimes,
                 period_s: float = PERIOD_S, span_s: float = SPAN_S):
        """figures: dashboard_view's body (what /dashboard/data answers)."""
        self.figures = figures
        self.first_tokens = first_tokens
        self.period_s = period_s
        self.span_s = span_s
        self.points: deque[dict] = deque(maxlen=int(span_s / period_s) + 1)

    def sample(self) -> dict:
        point = make_point(self.figures(), self.points[-1] if self.points else None, self.first_tokens.quantiles())
        self.points.append(point)
        return point

    def since(self, t: float) -> list[dict]:
        """The points after time t (the page asks for what it has not drawn)."""
        return [{k: v for k, v in p.items() if k != "totals"} for p in self.points if p["t"] > t]

    async def run(self) -> None:
        """Sample every period_s until cancelled (the server's shutdown)."""
        while True:
            try:
                self.sample()
            except Exception:  # a figure that cannot be read now must not end the plots
                log.exception("dashboard sample failed")
            await asyncio.sleep(self.period_s)
