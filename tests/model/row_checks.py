"""The batch-invariance check the blocked kernels' tests share."""

import torch


def assert_rows_independent(run_rows, x: torch.Tensor, shift: int = 5) -> None:
    """run_rows(x[:m]) gives every row the numbers that row gets alone, for
    every m, with the rows reordered, and on one thread as on torch's team:
    the kernels split outputs between threads, never a sum, and run each row
    through the same operations whatever its batch mates."""
    alone = torch.cat([run_rows(x[i : i + 1]) for i in range(x.shape[0])])
    for m in range(1, x.shape[0] + 1):
        assert torch.equal(run_rows(x[:m]), alone[:m])
    assert torch.equal(run_rows(x.roll(shift, 0)), alone.roll(shift, 0))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(run_rows(x), alone)
    finally:
        torch.set_num_threads(threads)
