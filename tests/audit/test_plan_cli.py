"""`bulkhead plan` end to end through the CLI: output, JSON and exit codes."""

import json
import subprocess
import sys
from pathlib import Path

from bulkhead.cli import main

INCIDENT_ARGS = [
    "--accelerator-memory", "141GiB",
    "--weights-bytes", "689883565256",
    "--tp", "8",
    "--context-length", "1048576",
]  # fmt: skip


def test_incident_numbers_exit_1_and_say_why(config_path, capsys):
    code = main(["plan", "--model", config_path("deepseek-v3"), *INCIDENT_ARGS])
    out = capsys.readouterr().out
    assert code == 1
    assert "681,280" in out and "1,048,576" in out
    assert "DOES NOT HOLD: 367,296 tokens short" in out


def test_json_output_carries_every_number(config_path, capsys):
    code = main(["plan", "--model", config_path("deepseek-v3"), *INCIDENT_ARGS, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert report["kv_bytes_per_token_per_rank"] == 70_272
    assert report["pool_tokens_per_worker"] == 681_280
    assert report["context_length"] == 1_048_576
    assert report["context_source"] == "--context-length"
    assert report["holds_context"] is False
    assert report["attention"] == "MLA"


def test_fp8_kv_fixes_the_incident_shape(config_path, capsys):
    code = main(["plan", "--model", config_path("deepseek-v3"), *INCIDENT_ARGS, "--kv-dtype", "fp8_e4m3"])
    assert code == 0
    assert "OK: the pool holds the context" in capsys.readouterr().out


def test_context_defaults_to_max_position_embeddings(config_path, capsys):
    code = main(
        ["plan", "--model", config_path("qwen2.5-72b"), "--accelerator-memory", "80GB", "--weights-bytes", "145GB",
         "--tp", "4", "--json"]
    )  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["context_length"] == 32_768
    assert report["context_source"] == "config max_position_embeddings"
    # usable  = floor(80,000,000,000 x 0.9)                      = 72,000,000,000
    # budget  = 72,000,000,000 - 36,250,000,000 - 2,147,483,648  = 33,602,516,352
    # pool    = floor(33,602,516,352 / 81,920) = floor(410,186.97) =  410,186
    assert report["pool_tokens_per_worker"] == 410_186


def test_glm_moe_with_a_context_it_cannot_hold(config_path, capsys):
    code = main(
        ["plan", "--model", config_path("glm-4.5"), "--accelerator-memory", "80GiB", "--weights-bytes", "717GB",
         "--tp", "8", "--page-size", "64", "--json"]
    )  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    # usable  = floor(85,899,345,920 x 0.9)                      = 77,309,411,328
    # weights = 717,000,000,000 / 8                              = 89,625,000,000  > usable
    assert report["kv_budget_bytes_per_rank"] < 0
    assert report["pool_tokens_per_worker"] == 0
    assert code == 1


def test_model_may_be_a_directory_holding_config_json(tmp_path, config_path, capsys):
    (tmp_path / "config.json").write_text(Path(config_path("llama-3-70b")).read_text())
    code = main(["plan", "--model", str(tmp_path), "--accelerator-memory", "80GiB", "--weights-bytes", "141GB", "--tp", "8"])
    assert code == 0
    assert "40,960" in capsys.readouterr().out


def test_bad_inputs_exit_2(tmp_path, config_path, capsys):
    missing = main(["plan", "--model", str(tmp_path / "nope.json"), "--accelerator-memory", "80GB", "--weights-bytes", "1"])
    bad_size = main(["plan", "--model", config_path("llama-3-70b"), "--accelerator-memory", "80 parsecs", "--weights-bytes", "1"])
    bad_split = main(["plan", "--model", config_path("llama-3-70b"), "--accelerator-memory", "80GB", "--weights-bytes", "1", "--tp", "3"])
    bad_dtype = main(["plan", "--model", config_path("llama-3-70b"), "--accelerator-memory", "80GB", "--weights-bytes", "1", "--kv-dtype", "int3"])
    (tmp_path / "broken.json").write_text("{not json")
    broken = main(["plan", "--model", str(tmp_path / "broken.json"), "--accelerator-memory", "80GB", "--weights-bytes", "1"])
    assert (missing, bad_size, bad_split, bad_dtype, broken) == (2, 2, 2, 2, 2)
    assert "error:" in capsys.readouterr().err


def test_bulkhead_plan_runs_in_its_own_process(config_path):
    result = subprocess.run(
        [sys.executable, "-m", "bulkhead.cli", "plan", "--model", config_path("deepseek-v3"), *INCIDENT_ARGS],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "pool tokens/worker" in result.stdout


def test_a_bare_accelerator_memory_is_an_input_error_not_80_bytes(config_path, capsys):
    code = main(["plan", "--model", config_path("llama-3-70b"), "--accelerator-memory", "80",
                 "--weights-bytes", "140GB"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--accelerator-memory '80': a number without a unit; give one, e.g. 80GiB or 80GB" in err
    bare_reserve = main(["plan", "--model", config_path("llama-3-70b"), "--accelerator-memory", "80GB",
                         "--weights-bytes", "140GB", "--activation-reserve", "2"])
    assert bare_reserve == 2 and "--activation-reserve '2'" in capsys.readouterr().err
