"""The arithmetic bench/peers.py reports with: percentiles, summaries,
ratios to the baseline, the guard cost, and the request bodies it sends."""

from bench.peers import requests_for
from bench.report import guard_cost, guard_line, level_table
from bench.workload import Endpoint, Prompt, percentile, summarise


def test_percentile_is_a_measured_value_by_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0
    assert percentile([3.0, 1.0], 99) == 3.0 and percentile([7.0], 99) == 7.0


def test_summary_counts_tokens_over_the_wall_time():
    records = [{"ttft": 1.0, "tpot": 0.1, "tokens": 10}, {"ttft": 3.0, "tpot": 0.3, "tokens": 30}]
    s = summarise(4.0, records)
    assert s["tok_s"] == 10.0 and s["output_tokens"] == 40 and s["requests"] == 2
    assert s["ttft_median_s"] == 2.0 and s["ttft_p99_s"] == 3.0 and s["tpot_median_s"] == 0.2


def level(tok_s, tpot, rss=100.0):
    return {"tok_s": tok_s, "ttft_median_s": 1.0, "ttft_p99_s": 2.0, "tpot_median_s": tpot, "peak_rss_mib": rss}


def test_every_figure_is_shown_as_a_ratio_to_bulkhead_colocated():
    levels = {"bulkhead": {4: level(40.0, 0.1)}, "transformers": {4: level(60.0, 0.05, rss=50.0)}}
    lines = level_table(levels, 4)
    bulkhead = next(line for line in lines if line.startswith("bulkhead"))
    peer = next(line for line in lines if line.startswith("transformers"))
    assert bulkhead.count("(1.00x)") == 5
    assert "60.0 (1.50x)" in peer and "50ms (0.50x)" in peer and "50MiB (0.50x)" in peer


def test_guard_cost_is_on_over_off_at_the_highest_common_concurrency():
    levels = {"bulkhead": {1: level(10.0, 0.1), 16: level(80.0, 0.2)},
              "bulkhead-no-guards": {1: level(11.0, 0.1), 16: level(100.0, 0.16)}}
    cost = guard_cost(levels)
    assert cost["concurrency"] == 16 and cost["tok_s_on_over_off"] == 0.8
    assert abs(cost["tpot_on_over_off"] - 1.25) < 1e-9
    assert "c=16" in guard_line(cost) and "0.80x" in guard_line(cost)
    assert guard_cost({"bulkhead": levels["bulkhead"]}) is None


def test_requests_per_level_is_a_count_or_a_multiple_of_the_clients():
    assert requests_for("2x", 16) == 32 and requests_for("5", 16) == 5


def test_each_server_is_asked_for_exactly_the_output_length_its_own_way():
    prompt = Prompt([11, 12, 13], "some text")
    bulkhead = Endpoint("http://x", "bench").body(prompt, 128)
    assert bulkhead["prompt"] == [11, 12, 13] and bulkhead["ignore_eos"] is True and bulkhead["temperature"] == 0
    llama = Endpoint("http://x", "bench", text_prompts=True, exact_length="min_tokens").body(prompt, 128)
    assert llama["prompt"] == "some text" and llama["min_tokens"] == 128 and "ignore_eos" not in llama
