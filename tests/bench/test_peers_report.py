"""The arithmetic bench/peers.py reports with: percentiles, summaries,
ratios to the baseline, the guard cost, and the request bodies it sends;
which levels count (every request produced its tokens); and the peers'
best configurations."""

import os

import pytest

from bench.peers import parse_args, requests_for
from bench.report import best_of, best_peer, guard_cost, guard_line, headline, level_table, lineage_cost, lineage_line
from bench.systems import VLLM_CORES, Settings, cpu_flags, llama_server_cmd, vllm_best_dtype
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


def test_lineage_cost_is_with_over_without_the_log_at_the_highest_common_concurrency():
    levels = {"bulkhead": {1: level(10.0, 0.1), 16: level(100.0, 0.2)},
              "bulkhead-lineage": {1: level(10.0, 0.1), 16: level(99.0, 0.2)}}
    cost = lineage_cost(levels)
    assert cost["concurrency"] == 16 and abs(cost["tok_s_with_over_without"] - 0.99) < 1e-9
    assert "c=16" in lineage_line(cost) and "0.990x" in lineage_line(cost)
    assert lineage_cost({"bulkhead": levels["bulkhead"]}) is None
    assert "not measured" in lineage_line(None)


def test_requests_per_level_is_a_count_or_a_multiple_of_the_clients():
    assert requests_for("2x", 16) == 32 and requests_for("5", 16) == 5
    # The workload: one client with six requests in a row, 16 clients with two each.
    assert requests_for("1:6,2x", 1) == 6 and requests_for("1:6,2x", 16) == 32
    with pytest.raises(ValueError, match="concurrency 4"):
        requests_for("1:6,16:2x", 4)


def test_each_server_is_asked_for_exactly_the_output_length_its_own_way():
    prompt = Prompt([11, 12, 13], "some text")
    bulkhead = Endpoint("http://x", "bench").body(prompt, 128)
    assert bulkhead["prompt"] == [11, 12, 13] and bulkhead["ignore_eos"] is True and bulkhead["temperature"] == 0
    llama = Endpoint("http://x", "bench", text_prompts=True, exact_length="min_tokens").body(prompt, 128)
    assert llama["prompt"] == "some text" and llama["min_tokens"] == 128 and "ignore_eos" not in llama


# -- a level is a figure only when every request produced the tokens asked for ----------


def test_a_level_with_any_request_short_of_its_tokens_is_invalid_not_a_figure():
    full = [{"ttft": 0.1, "tpot": 0.01, "tokens": 128}] * 3
    assert "invalid" not in summarise(1.0, full, expected_tokens=128)
    # llama-cpp-python's server cut running streams when another request came: 14.5 tok/s at a 1 ms TPOT.
    cut = full + [{"ttft": 0.1, "tpot": 0.001, "tokens": 7}]
    s = summarise(1.0, cut, expected_tokens=128)
    assert s["invalid"] == "1 of 4 requests produced other than 128 tokens (7..7)"
    too_many = summarise(1.0, [{"ttft": 0.1, "tpot": 0.01, "tokens": 129}], expected_tokens=128)
    assert "invalid" in too_many


def test_an_invalid_level_shows_its_reason_and_takes_part_in_no_ratio_best_or_guard_cost():
    bad = level(500.0, 0.001) | {"invalid": "3 of 4 requests produced other than 128 tokens (5..9)"}
    levels = {"bulkhead": {16: level(100.0, 0.1)}, "bulkhead-no-guards": {16: bad},
              "llama-cpp": {16: bad}, "vllm": {16: level(200.0, 0.05)}}
    lines = level_table(levels, 16)
    llama = next(line for line in lines if line.startswith("llama-cpp"))
    assert "INVALID" in llama and "500.0" not in llama
    assert best_peer(levels, 16)[0] == "vllm"
    assert guard_cost(levels) is None
    # With bulkhead's own row invalid, nothing is a ratio to it.
    levels["bulkhead"] = {16: bad}
    assert "(2.00x)" not in next(line for line in level_table(levels, 16) if line.startswith("vllm"))
    assert headline(levels) == []


def test_the_headline_compares_bulkhead_with_the_best_valid_peer_never_with_itself():
    levels = {"bulkhead": {1: level(47.0, 0.02), 16: level(135.0, 0.1)},
              "bulkhead-no-guards": {16: level(400.0, 0.1)},
              "transformers": {1: level(15.0, 0.06), 16: level(92.0, 0.2)},
              "llama-cpp": {1: level(70.6, 0.011), 16: level(150.0, 0.1)},
              "vllm": {1: level(34.5, 0.03), 16: level(255.8, 0.06)}}
    lines = headline(levels)
    assert lines[0].startswith("c=1: bulkhead 47.0") and "llama-cpp 70.6 (0.67x)" in lines[0]
    assert lines[1].startswith("c=16: bulkhead 135.0") and "vllm 255.8 (0.53x)" in lines[1]


def test_a_peer_in_several_configurations_counts_with_its_best_valid_one_at_each_level():
    variants = {"both-cores": {1: level(30.0, 0.03), 16: level(255.8, 0.06)},
                "reserved-core": {1: level(34.5, 0.03), 16: level(300.0, 0.06) | {"invalid": "short"}}}
    best = best_of(variants)
    assert best[1]["tok_s"] == 34.5 and best[1]["variant"] == "reserved-core"
    assert best[16]["tok_s"] == 255.8 and best[16]["variant"] == "both-cores"
    only_bad = best_of({"a": {4: level(1.0, 0.1) | {"invalid": "short"}}})
    assert only_bad[4]["invalid"] == "short"


# -- peers in their best configuration -----------------------------------------------------


def test_vllm_runs_bf16_where_the_cpu_computes_in_it_and_fp32_elsewhere():
    epyc = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
    assert cpu_flags(epyc) >= {"avx512_bf16", "avx2"}
    assert vllm_best_dtype(cpu_flags(epyc)) == "bfloat16"
    assert vllm_best_dtype({"avx2", "amx_bf16", "amx_tile"}) == "bfloat16"
    assert vllm_best_dtype(cpu_flags("flags\t: fpu avx2 avx512f\n")) == "float32"
    assert vllm_best_dtype(cpu_flags("")) == "float32"


def test_vllm_is_measured_with_both_cores_and_with_one_reserved_and_compiled_by_default():
    assert VLLM_CORES["both-cores"] == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert VLLM_CORES["reserved-core"] == {}
    args = parse_args([])
    assert args.vllm_args == "" and args.vllm_cores == ["both-cores", "reserved-core"]
    assert "vllm" in args.systems and "vllm-fp32" in args.systems and "vllm-bf16" not in args.systems


def test_vllm_is_measured_with_and_without_the_tcmalloc_preload_under_each_core_setting():
    from pathlib import Path

    from bench.peers import vllm_settings
    from bench.systems import tcmalloc_path, vllm_env

    args = parse_args([])
    assert args.vllm_malloc == ["tcmalloc", "glibc"]
    assert vllm_settings(args.vllm_cores, args.vllm_malloc) == [
        ("both-cores", "tcmalloc"), ("both-cores", "glibc"), ("reserved-core", "tcmalloc"), ("reserved-core", "glibc")]
    s = Settings(Path("/m"), Path("/m.gguf"), 1.0, 2048, Path("/tmp"))
    lib = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
    env = vllm_env(s, "both-cores", "tcmalloc", lib, inherited_preload="/other.so")
    assert env["LD_PRELOAD"] == f"{lib}:/other.so" and env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "LD_PRELOAD" not in vllm_env(s, "reserved-core", "glibc", lib)
    with pytest.raises(RuntimeError, match="libtcmalloc"):  # asked for, not there: no silent glibc figure
        vllm_env(s, "both-cores", "tcmalloc", None)
    assert tcmalloc_path(("/nonexistent/libtcmalloc.so.4",)) is None
    with pytest.raises(SystemExit):
        parse_args(["--vllm-malloc", "jemalloc"])


def test_vllm_is_compiled_and_bf16_on_the_model_given_and_its_command_line_is_quoted_whole(tmp_path):
    from pathlib import Path

    from bench.systems import command_line, vllm_cmd

    (tmp_path / "model.safetensors").write_bytes(b"")
    s = Settings(tmp_path, Path("/m.gguf"), 1.0, 2048, Path("/tmp"))
    cmd = vllm_cmd(Path("/venv/bin/python"), s, 8000, "bfloat16", [])
    assert cmd[cmd.index("--model") + 1] == str(tmp_path) and cmd[cmd.index("--dtype") + 1] == "bfloat16"
    assert not set(cmd) & {"-O0", "--enforce-eager"}
    line = command_line(cmd, {"LD_PRELOAD": "/a b.so", "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert line.startswith("LD_PRELOAD='/a b.so' VLLM_CPU_KVCACHE_SPACE=1 /venv/bin/python -m vllm.")


def test_a_peer_given_a_ggufs_import_reads_the_gguf_dequantized_once(tmp_path, monkeypatch):
    # bulkhead's import of a GGUF holds no weights (it serves the file as
    # stored): vLLM pointed at it failed with "Cannot find any model weights".
    from pathlib import Path

    import bulkhead.model.gguf_import as gguf_import
    from bench import systems

    imported = tmp_path / "SmolLM2.Q4_1-abc"
    imported.mkdir()
    converted = []

    def convert(source, out):
        converted.append(Path(source))
        out.mkdir()
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(gguf_import, "convert_gguf", convert)
    s = Settings(imported, Path("/m.gguf"), 1.0, 2048, Path("/tmp"))
    assert systems.weights_dir(s) == tmp_path / "SmolLM2.Q4_1-abc-hf" and converted == [Path("/m.gguf")]
    assert systems.weights_dir(s) == tmp_path / "SmolLM2.Q4_1-abc-hf" and len(converted) == 1  # once


def test_the_tcmalloc_setting_is_checked_in_every_process_of_the_server(tmp_path):
    from bench.systems import process_tree, tcmalloc_mapped

    for pid, maps in ((1, "7f00 r-xp /usr/lib/libtcmalloc_minimal.so.4\n"), (2, "7f00 r-xp /usr/lib/libc.so.6\n")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "maps").write_text(maps)
    assert tcmalloc_mapped([1, 2, 3], tmp_path) == [True, False]  # 3 unreadable: left out
    assert process_tree(os.getpid())[0] == os.getpid()


def test_every_system_serves_the_model_and_gguf_given():
    from pathlib import Path

    args = parse_args(["--model", "/ckpt/bf16", "--gguf", "/ckpt/q4_0.gguf"])
    assert args.model == Path("/ckpt/bf16") and args.gguf == Path("/ckpt/q4_0.gguf")
    assert parse_args([]).model is None  # the bundled SmolLM2, resolved by the harness


def test_llama_server_gets_a_slot_per_client_and_the_context_for_each():
    from pathlib import Path

    s = Settings(Path("/m"), Path("/m.gguf"), 1.0, 2048, Path("/tmp"))
    cmd = llama_server_cmd(Path("/bin/llama-server"), s, 8080, slots=16)
    assert cmd[cmd.index("--parallel") + 1] == "16" and "--cont-batching" in cmd
    assert cmd[cmd.index("--ctx-size") + 1] == str(2048 * 16)
    assert cmd[cmd.index("--model") + 1] == "/m.gguf"
    assert cmd[cmd.index("--flash-attn") + 1] == "on"
    assert cmd[cmd.index("--threads") + 1] == cmd[cmd.index("--threads-batch") + 1] == str(os.cpu_count())
