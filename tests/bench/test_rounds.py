"""bench/rounds.py: the same comparison several times, order alternating,
ratios taken within each round."""

import pytest

from bench.rounds import aggregate, parse_args, round_order, table, with_settings


def level(tok_s, p99=2.0, invalid=None):
    row = {"tok_s": tok_s, "ttft_median_s": 1.0, "ttft_p99_s": p99, "tpot_median_s": 0.05, "peak_rss_mib": 1.0}
    return row | ({"invalid": invalid} if invalid else {})


def test_every_other_round_runs_the_systems_in_reverse_so_a_drift_favours_neither():
    systems = ["a", "b", "c"]
    assert [round_order(systems, i) for i in range(3)] == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]


def test_each_ratio_comes_from_one_round_and_the_median_and_range_are_reported():
    # The machine halves its speed in round 2: the figures swing, the ratio does not.
    rounds = [{"a": {"16": level(100.0, 2.0)}, "b": {"16": level(90.0, 3.0)}},
              {"a": {"16": level(50.0, 4.0)}, "b": {"16": level(45.0, 6.0)}},
              {"a": {16: level(80.0, 2.0)}, "b": {16: level(80.0, 2.0)}}]
    row = aggregate(rounds, ["a", "b"], [16])["b"][16]
    assert row["tok_s"] == (80.0, 45.0, 90.0)
    assert row["ratio"] == pytest.approx((0.9, 0.9, 1.0))
    assert row["p99_ratio"] == pytest.approx((1.5, 1.0, 1.5))
    assert row["rounds"] == 3
    lines = table(aggregate(rounds, ["a", "b"], [16]), "a")
    assert any(line.startswith("b") and "0.90x (0.90x-1.00x)" in line for line in lines)


def test_a_level_invalid_in_any_round_is_not_a_figure():
    rounds = [{"a": {"4": level(10.0)}, "b": {"4": level(9.0)}},
              {"a": {"4": level(10.0)}, "b": {"4": level(1.0, invalid="2 of 8 requests stopped early")}}]
    agg = aggregate(rounds, ["a", "b"], [4])
    assert agg["b"][4] == {"invalid": "round 2: 2 of 8 requests stopped early"}
    assert "tok_s" in agg["a"][4]
    assert any("INVALID, not a figure: round 2: 2 of 8 requests stopped early" in line for line in table(agg, "a"))
    # The base invalid in a round leaves no ratio for anyone.
    rounds = [{"a": {"4": level(10.0, invalid="cut")}, "b": {"4": level(9.0)}}]
    assert aggregate(rounds, ["a", "b"], [4])["b"][4] == {"invalid": "a in round 1: cut"}


def test_a_comparison_needs_two_systems_and_passes_other_flags_on():
    with pytest.raises(SystemExit):
        parse_args(["--systems", "bulkhead"])
    args = parse_args(["--systems", "bulkhead,bulkhead-disagg", "--rounds", "2", "--", "--requests-per-level", "1x"])
    assert args.systems == ["bulkhead", "bulkhead-disagg"] and args.peers_args == ["--requests-per-level", "1x"]
    with pytest.raises(SystemExit):  # each round's own flags are this script's
        parse_args(["--systems", "a,b", "--", "--out=/tmp/x"])


def test_main_runs_the_rounds_in_alternating_order_and_keeps_each_rounds_results(tmp_path, monkeypatch, capsys):
    import json

    from bench import rounds

    orders = []

    def fake_peers(cmd):
        systems = cmd[cmd.index("--systems") + 1].split(",")
        out = tmp_path / "out" / cmd[cmd.index("--out") + 1].rsplit("/", 1)[-1]
        orders.append(systems)
        out.mkdir(parents=True)
        levels = {s: {"16": level(100.0 if s == "a" else 80.0)} for s in systems}
        (out / "peers-x.json").write_text(json.dumps({"levels": levels}))
        return 0

    monkeypatch.setattr(rounds.stopping, "run_child", fake_peers)
    loads = iter([(1.0, 2.0, 3.0), (4.0, 5.0, 6.0)] * 3)
    monkeypatch.setattr(rounds.os, "getloadavg", lambda: next(loads))
    monkeypatch.setattr(rounds.stopping, "exit_on_sigterm", lambda: None)  # not this test process's handler
    assert rounds.main(["--systems", "a,b", "--rounds", "3", "--out", str(tmp_path / "out")]) == 0
    assert orders == [["a", "b"], ["b", "a"], ["a", "b"]]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["round1", "round2", "round3", "rounds.json"]
    saved = json.loads((tmp_path / "out" / "rounds.json").read_text())
    assert saved["levels"]["b"]["16"]["ratio"] == [0.8, 0.8, 0.8]
    printed = capsys.readouterr().out
    assert "0.80x (0.80x-0.80x)" in printed
    # How loaded the machine was: before and after each round, printed and kept.
    assert saved["load"][1] == {"round": 2, "order": ["b", "a"], "load_before": [1.0, 2.0, 3.0],
                                "load_after": [4.0, 5.0, 6.0]}
    assert "round 3: load average (1/5/15 min) before 1.00/2.00/3.00, after 4.00/5.00/6.00" in printed


def test_each_setting_of_a_peer_measured_in_every_round_gets_its_own_row():
    rounds = [{"a": {}, "vllm": {}, "vllm[both-cores,tcmalloc]": {}, "vllm[reserved-core,glibc]": {}},
              {"a": {}, "vllm": {}, "vllm[both-cores,tcmalloc]": {}}]
    # A setting missing from a round (it failed to start) would pool fewer rounds than the rest: left out.
    assert with_settings(["a", "vllm"], rounds) == ["a", "vllm", "vllm[both-cores,tcmalloc]"]
