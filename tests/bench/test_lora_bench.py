"""bench/lora.py's parts that need no server: vLLM gets the same adapters under
the same names, and a level that did not finish as asked yields no ratio."""
from pathlib import Path

import pytest

from bench.lora import ADAPTERS, parse_args, ratios, vllm_lora_flags


def test_vllm_serves_the_same_adapters_under_the_same_names():
    dirs = {name: Path(f"/adapters/{name}") for name in ADAPTERS}
    flags = vllm_lora_flags(dirs, 16)
    assert flags[:2] == ["--enable-lora", "--lora-modules"]
    assert flags[2:6] == [f"{n}=/adapters/{n}" for n in ADAPTERS]
    assert flags[6:] == ["--max-lora-rank", "16", "--max-loras", "4"]  # all four in one batch


def _level(tokens, wall, invalid=None):
    return {"output_tokens": tokens, "wall_s": wall, **({"invalid": invalid} if invalid else {})}


def test_ratios_pool_rounds_and_refuse_an_invalid_level():
    one = {"base-16": _level(100, 1), "lora-16": _level(40, 1), "base-1": _level(10, 1), "lora-1": _level(9, 1)}
    two = {"base-16": _level(100, 3), "lora-16": _level(60, 1), "base-1": _level(10, 1), "lora-1": _level(9, 1)}
    assert ratios([one, two]) == {"16 clients over 4 adapters / base": pytest.approx((100 / 2) / (200 / 4)),
                                  "1 client on an adapter / base": pytest.approx(0.9)}
    assert ratios([one, {**two, "lora-1": _level(3, 1, invalid="short")}]) is None


def test_a_vllm_run_needs_its_base_model_and_known_systems():
    with pytest.raises(SystemExit):
        parse_args(["--systems", "vllm"])
    with pytest.raises(SystemExit):
        parse_args(["--systems", "sglang"])
    assert parse_args(["--systems", "bulkhead,vllm", "--vllm-model", "/m"]).systems == ["bulkhead", "vllm"]
