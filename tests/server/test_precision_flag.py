"""`bulkhead serve --precision auto|exact`: the users' one switch over the
kernels (bulkhead.server.serve_flags), the per-kernel overrides only under
--help-all."""

import contextlib
import io

import pytest

from bulkhead.cli import build_parser, main
from bulkhead.launch.engine_flags import engine_config
from bulkhead.server.serve_flags import check_precision_flags


def serve_args(*flags: str):
    return build_parser().parse_args(["serve", *flags])


def test_exact_gives_the_engine_the_fp32_reference_everywhere(tmp_path):
    config = engine_config(serve_args("--precision", "exact"), tmp_path, "m")
    assert (config.linear_kernel, config.kv_dtype) == ("exact", "float32")
    assert config.prefill_attention == config.prefill_glue == "auto"  # auto beside exact layers: torch's fp32 ops
    default = engine_config(serve_args(), tmp_path, "m")
    assert (default.linear_kernel, default.kv_dtype) == ("auto", "auto")


def test_exact_refuses_a_reduced_precision_override_beside_it():
    assert check_precision_flags(serve_args("--precision", "exact")) is None
    assert check_precision_flags(serve_args("--linear-kernel", "q4")) is None  # auto: overrides are A/B runs
    problem = check_precision_flags(serve_args("--precision", "exact", "--linear-kernel", "q4-i16in"))
    assert problem is not None and "--linear-kernel q4-i16in" in problem
    assert "--kv-dtype bfloat16" in check_precision_flags(serve_args("--precision", "exact", "--kv-dtype", "bfloat16"))
    with contextlib.redirect_stderr(io.StringIO()) as err, pytest.raises(SystemExit) as exit:
        main(["serve", "--precision", "exact", "--prefill-attention", "bf16"])  # refused before any model loads
    assert exit.value.code == 2 and "--prefill-attention bf16 contradicts" in err.getvalue()


def test_precision_is_in_plain_help_and_the_kernel_overrides_are_not():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "--precision" in out.getvalue()
    for override in ("--linear-kernel", "--decode-attention", "--prefill-attention", "--decode-glue"):
        assert override not in out.getvalue()


def test_retired_kernels_are_not_accepted():
    for kernel in ("int4", "q4-bf16in-all", "q4-bf16-prefill", "onednn-bf16", "q4-bf16in"):
        with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit):
            serve_args("--linear-kernel", kernel)
