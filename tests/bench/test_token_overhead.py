"""bench/token_overhead.py's per-thread arithmetic and its tiny checkpoint (the served load it drives needs a server)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import token_overhead as to  # noqa: E402
from context_switches import Counters  # noqa: E402


def test_threads_are_summed_by_name_and_a_thread_born_meanwhile_counts_from_zero():
    before = {1: Counters(10, 1, 1.0), 2: Counters(5, 0, 0.5)}
    after = {1: Counters(30, 2, 1.5), 2: Counters(9, 1, 0.75), 3: Counters(4, 0, 0.25)}
    got = to.per_thread(before, after, {1: "MainThread", 2: "ZMQbg/IO/0", 3: "ZMQbg/IO/0"})
    assert got == {"MainThread": Counters(20, 1, 0.5), "ZMQbg/IO/0": Counters(8, 1, 0.5)}


def test_an_unnamed_thread_is_named_by_its_id():
    assert to.per_thread({}, {7: Counters(1, 0, 0.0)}, {}) == {"7": Counters(1, 0, 0.0)}


def test_the_tiny_checkpoint_has_the_tiny_shape_and_the_tokenizer(tmp_path):
    out = to.tiny_model(tmp_path / "tiny")
    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == (64, 2, 128)
    assert (out / "tokenizer.json").exists()
    assert to.tiny_model(out) == out  # written once
