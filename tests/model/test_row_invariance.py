"""The start-up measurement of batch-invariant decode row counts, for each
linear kernel the model can run (bulkhead.model.linear_kernel)."""

import pytest
import torch

from bulkhead.model.linear_kernel import onednn_usable, prepare_one
from bulkhead.model.row_invariance import invariant_row_multiple

# SmolLM2-135M's linear shapes: fused qkv, o, fused gate/up, down, lm_head.
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576)]


MAX_ROWS = 16


def _needs(usable: bool, what: str):
    return pytest.mark.skipif(not usable, reason=f"this torch build has no {what}")


@pytest.fixture(scope="module", params=[
    "aten",
    pytest.param("onednn", marks=_needs(onednn_usable(torch.float32), "oneDNN linear")),
])
def kernel(request):
    return request.param


def weights(seed: int, kernel: str):
    gen = torch.Generator().manual_seed(seed)
    return [prepare_one(torch.randn(shape, generator=gen), kernel) for shape in SHAPES]


def linear(x, layer):
    return layer(x, decode=True)  # the rows the measurement is about


@pytest.fixture(scope="module")
def measured(kernel):
    return invariant_row_multiple(weights(0, kernel), max_rows=MAX_ROWS)


def test_the_measured_multiple_holds_for_other_weights_and_inputs(measured, kernel):
    # The probe uses one set of inputs; the claim is about the kernels, so it
    # must hold for weights and activations it never saw.
    r = measured
    if r is None:
        pytest.skip("no batch-invariant row multiple on this CPU: the engine falls back to fixed tiles")
    gen = torch.Generator().manual_seed(1)
    for w in weights(2, kernel):
        x = torch.randn(MAX_ROWS, w.in_features, generator=gen)
        alone = [linear(torch.cat([x[i : i + 1], x.new_zeros(r - 1, w.in_features)]), w)[0] for i in range(MAX_ROWS)]
        for m in range(r, MAX_ROWS + 1, r):
            assert torch.equal(linear(x[:m], w), torch.stack(alone[:m])), (w.out_features, m)


def test_smaller_multiples_are_refused_because_rows_really_differ_there(measured, kernel):
    # Padding is the guard: without it (multiples below r) some row's result
    # changes with the batch size on this CPU, and the measurement sees it.
    r = measured
    if r is None:
        pytest.skip("no batch-invariant row multiple on this CPU")
    smaller = tuple(c for c in (1, 2, 4, 8, 16) if c < r)
    if not smaller:
        pytest.skip(f"every batch size is invariant on this CPU (r = {r}): no padding needed")
    assert invariant_row_multiple(weights(0, kernel), max_rows=MAX_ROWS, candidates=smaller) is None
