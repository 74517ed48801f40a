"""dashboard_history: the ring buffer behind /dashboard's plots (pure: dicts
and a fake clock, no server)."""

import asyncio

from bulkhead.server.dashboard_history import DashboardHistory, FirstTokenTimes, make_point

POOL = {"name": "decode-0", "num_pages": 10, "owned": 3, "cached": 1, "dirty": 0, "free": 6}


def view(t, tokens, throttled=0, transfers=0):
    return {"time": t, "pools": [POOL], "transfers_in_flight": transfers,
            "tenants": {"alpha": {"output_tokens_served": tokens, "throttled": throttled}}}


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_points_carry_rates_from_the_totals_change_and_a_reset_counts_as_none():
    first = make_point(view(10.0, 100), None, (None, None))
    assert first["tokens_per_s"] == {} and first["pools"]["decode-0"]["owned"] == 3
    second = make_point(view(12.0, 140, throttled=4, transfers=2), first, (0.1, 0.3))
    assert second["tokens_per_s"] == {"alpha": 20.0} and second["throttled_per_s"] == {"alpha": 2.0}
    assert second["transfers_in_flight"] == 2 and (second["ttft_p50"], second["ttft_p99"]) == (0.1, 0.3)
    restarted = make_point(view(14.0, 5), second, (None, None))  # a worker restarted: its total began again
    assert restarted["tokens_per_s"] == {"alpha": 0.0}


def test_first_token_times_give_median_and_p99_of_the_window_only():
    clock = Clock()
    times = FirstTokenTimes(window_s=10.0, clock=clock)
    assert times.quantiles() == (None, None)
    for s in [0.5] * 50:
        times.add(s)
    clock.now += 11  # those are out of the window now
    for s in [0.1] * 98 + [0.9, 2.0]:
        times.add(s)
    assert times.quantiles() == (0.1, 0.9)
    clock.now += 11
    assert times.quantiles() == (None, None)


def test_the_buffer_keeps_the_last_span_and_answers_what_a_page_has_not_drawn():
    t = [0.0]

    def figures():
        t[0] += 2.0
        return view(t[0], int(t[0]) * 10)

    history = DashboardHistory(figures, FirstTokenTimes(), period_s=2.0, span_s=20.0)
    for _ in range(30):
        history.sample()
    assert len(history.points) == 11  # 20 s of 2 s points, bounded
    newer = history.since(56.0)
    assert [p["t"] for p in newer] == [58.0, 60.0]
    assert "totals" not in newer[0] and newer[0]["tokens_per_s"] == {"alpha": 10.0}


def test_the_sampler_survives_a_figure_that_cannot_be_read():
    calls = []

    def figures():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a worker table changed size")
        return view(float(len(calls)), 0)

    history = DashboardHistory(figures, FirstTokenTimes(), period_s=0.001)

    async def run_a_while():
        task = asyncio.create_task(history.run())
        for _ in range(1000):  # bounded: a few ms of samples
            if len(history.points) >= 2:
                break
            await asyncio.sleep(0.001)
        task.cancel()

    asyncio.run(run_a_while())
    assert len(history.points) >= 2
