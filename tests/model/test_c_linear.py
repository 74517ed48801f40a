"""The one C linear library (csrc/linear.c: one driver, a micro-kernel per
format) computes, for fixed inputs, the very bits the five per-experiment
files it replaced computed (before 2026-12-07): DIGESTS holds the sha256 of
each kernel's output as the old files gave it. Row counts 1-13 cover every
tail of every micro-kernel's tile (8, 6 and 4 rows); 96 outputs are three
blocks, so the threads share them."""

import hashlib

import pytest
import torch

from bulkhead.model import bf16in_kernel, c_linear, head_kernel, head_linear, i16in_kernel, q4_kernel
from tests.model.grid_weights import gguf_q4_1, gguf_q8_0
from tests.model import kernel_calls

ROWS = tuple(range(1, 14))
N, K = 96, 128
DIGESTS = {
    "linear_q4": "d22c1f86bd197e7913afe9c6a44a78645ef8baefe3213a002c60b7716f30c05a",
    "linear_q4_i16in": "f561ddac2717ec5045a477a9e4411d6160499403939c6e780a9c8277fa3e8c12",
    "linear_q8_i16in": "198ab80f367450c466068985753cfb11e507170bd99cdfbf57aaa5ba9cff46d0",
    # The lm_head's Q8_0 kernel over the file's fp16 scales (linear_q8a.h): linear_q8_i16in's bits.
    "linear_q8_0_i16in": "198ab80f367450c466068985753cfb11e507170bd99cdfbf57aaa5ba9cff46d0",
    "linear_bf16w": "2668e6d13c56d468ec1c155c8eed7f14eae0ff01de0b6b5bda6dd7e8b75543cb",
    "linear_bf16in": "4bf02aec0aaeb3004de2b03c8ffc924f82e273231c4d55cfa0278414b1dfd338",
    "linear_bf16in_silu_mul": "1e26355165e56937c7ad166ca3eecf6f15ed9328f3d47b9c9f7efd8d42c2d293",
    # A bf16 checkpoint's decode rows (added after the merge): the prompt kernel's bits, row for row.
    "linear_bf16_bf16in": "4bf02aec0aaeb3004de2b03c8ffc924f82e273231c4d55cfa0278414b1dfd338",
}


def outputs(kernel: str) -> list[torch.Tensor]:
    """The kernel's output for each row count in ROWS, on seeded inputs with
    a NaN and an inf in the last two rows of the largest call."""
    gen = torch.Generator().manual_seed(7)
    w4, w8 = gguf_q4_1(N, K, seed=3), gguf_q8_0(N, K, seed=4)
    xs = [torch.randn(m, K, generator=gen) for m in ROWS]
    xs[-1][-2, 5], xs[-1][-1, 9] = float("nan"), float("inf")
    run = {
        "linear_q4": lambda x: kernel_calls.linear_q4(x, kernel_calls.q4_pack(w4)),
        "linear_q4_i16in": lambda x: kernel_calls.linear_q4_i16in(x, kernel_calls.i16in_pack_q4(w4)),
        "linear_q8_i16in": lambda x: kernel_calls.linear_q8_i16in(x, i16in_kernel.pack_q8(w8)),
        "linear_q8_0_i16in": lambda x: head_linear.linear_q8_0_i16in(x, head_linear.pack_q8_0(w8)),
        "linear_bf16w": lambda x: head_kernel.linear_bf16w(x, head_kernel.pack(w4)),
        "linear_bf16in": lambda x: bf16in_kernel.linear_bf16in(x, bf16in_kernel.pack(w4)),
        "linear_bf16in_silu_mul": lambda x: bf16in_kernel.linear_bf16in_silu_mul(x, bf16in_kernel.pack(w4[:64])),
        "linear_bf16_bf16in": lambda x: bf16in_kernel.linear_bf16_bf16in(x, bf16in_kernel.pack(w4)),
    }[kernel]
    return [run(x) for x in xs]


def digest(ys: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for y in ys:
        h.update(y.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def needs(kernel: str):
    module = {"linear_q4_i16in": i16in_kernel, "linear_q8_i16in": i16in_kernel,
              "linear_q8_0_i16in": i16in_kernel}.get(
        kernel, bf16in_kernel if kernel.startswith(("linear_bf16i", "linear_bf16_")) else q4_kernel)
    return pytest.mark.skipif(module.load() is None, reason=f"{kernel} cannot run here")


@pytest.mark.parametrize("kernel", [pytest.param(k, marks=needs(k)) for k in DIGESTS])
def test_each_kernel_gives_the_bits_the_per_format_files_gave(kernel):
    assert digest(outputs(kernel)) == DIGESTS[kernel]


def test_one_library_serves_every_format():
    lib = c_linear.load()
    if lib is None:
        pytest.skip("no C compiler with OpenMP here")
    assert q4_kernel.load() is lib and head_kernel.load() is lib
    assert bf16in_kernel.load() in (lib, None) and i16in_kernel.load() in (lib, None)
