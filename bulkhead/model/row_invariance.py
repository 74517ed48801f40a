"""Which decode batch sizes give every row the numbers it would get alone.

A CPU GEMM picks its kernel by the number of rows, and different kernels sum
in different orders, so one request's logits can change with how many other
requests share its decode step. The isolation oracle (a request's greedy
output must not depend on its batch-mates, see `bulkhead probe`) needs them
not to change.

Measured on this project's machine (AMD EPYC, 2 threads): with MKL's sgemm a
row's result is the same in every batch whose row count is a multiple of 4
(1 thread: every count >= 4), but not at 1, 2 or 3 rows; with oneDNN over
laid-out weights (bulkhead.model.linear_kernel), every even count. That is a property of the BLAS build, the CPU and
the thread count, not of torch, so it is measured at start-up on the weights
the server will run rather than assumed: `invariant_row_multiple` finds the
smallest R for which padding decode batches to a multiple of R rows is
batch-invariant. The engine falls back to fixed row tiles when no R is found.
"""

from __future__ import annotations

import torch

from bulkhead.model.linear_kernel import Linear

CANDIDATES = (1, 2, 4, 8, 16)


def invariant_row_multiple(weights: list[Linear], max_rows: int, candidates: tuple[int, ...] = CANDIDATES,
                           dtype: torch.dtype = torch.float32) -> int | None:
    """Smallest R in candidates such that, for every weight, a row of x @ w.T
    gets the same numbers at any position of any batch whose size is a
    multiple of R (up to max_rows, rounded up), through the layers' decode
    kernel. None when no candidate holds."""
    shapes = {(w.out_features, w.in_features): w for w in weights}.values()  # one probe per distinct shape
    for r in candidates:
        if all(_holds(w, r, -(-max_rows // r) * r, dtype) for w in shapes):
            return r
    return None


def _holds(w: Linear, r: int, max_rows: int, dtype: torch.dtype) -> bool:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(max_rows, w.in_features, generator=gen).to(dtype)

    def decode(rows: torch.Tensor) -> torch.Tensor:
        return w(rows, decode=True)  # the kernel the model runs decode rows with

    full = decode(x)
    # A row's result may depend on where it sits in the batch (edge blocks
    # take other kernels): moving every row one place must not change it ...
    if not torch.equal(decode(x.roll(1, 0)), full.roll(1, 0)):
        return False
    # ... nor may the batch size, at any multiple of r; with the check above,
    # any row at any position of any such batch gets the same numbers.
    if not all(torch.equal(decode(x[:m]), full[:m]) for m in range(r, max_rows, r)):
        return False
    # Each row alone too (padded to r), not only the first: a kernel that
    # rounds its output (bf16) hides most differences of its sums, so one
    # row can pass by luck where the next one shows the other kernel
    # (measured: a 1-row bf16 probe passed while 69 of 240 batches differed).
    pad = x.new_zeros(r - 1, w.in_features)
    return all(torch.equal(decode(torch.cat([x[i : i + 1], pad]))[0], full[i]) for i in range(max_rows))
