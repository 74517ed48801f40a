"""The soak's and the side channel's pure parts: the canary check, the AUC, memory sampling."""

import subprocess
import sys

import pytest

from bench.canaries import CanaryLedger
from bench.proc_memory import MemoryTrace, descendants, rss_bytes
from bench.roc import auc_shorter_is_positive, chance_of_at_least


def test_a_canary_in_another_tenants_output_is_a_hit():
    ledger = CanaryLedger()
    alpha, beta = ledger.mint("alpha"), ledger.mint("beta")
    assert ledger.check("beta", beta, f"sure: {beta} and also {alpha}") == [
        type(ledger.hits[0])("beta", "alpha", alpha)]
    assert ledger.echoes == 1
    assert ledger.check("alpha", alpha, f"{alpha} {alpha}") == []  # its own canary is no leak
    assert ledger.check("alpha", alpha, "ZQ-00000000") == [] and ledger.unowned == 1
    assert len(ledger.hits) == 1


def test_auc_counts_a_short_ttft_as_a_guess_of_the_secret():
    assert auc_shorter_is_positive([0.1, 0.2], [1.0, 2.0]) == 1.0
    assert auc_shorter_is_positive([1.0, 2.0], [0.1, 0.2]) == 0.0
    assert auc_shorter_is_positive([1.0, 3.0], [2.0, 2.0]) == 0.5
    assert auc_shorter_is_positive([1.0], [1.0]) == 0.5
    with pytest.raises(ValueError):
        auc_shorter_is_positive([], [1.0])


def test_chance_of_an_auc_is_exact_for_small_samples():
    assert chance_of_at_least(1.0, 2, 2) == pytest.approx(1 / 6)  # 1 of C(4, 2) orderings
    assert chance_of_at_least(0.0, 3, 4) == 1.0
    assert chance_of_at_least(0.5, 30, 30) == pytest.approx(0.5)  # normal approximation, symmetric


def test_memory_trace_sums_the_process_tree():
    import os

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in descendants(os.getpid())
        alone = MemoryTrace(child.pid).sample()
        tree = MemoryTrace(os.getpid()).sample()
        # The child's RSS counts in its parent's tree (half of it, as a margin
        # for this process's own RSS moving between the two reads).
        assert alone > 0 and tree - rss_bytes(os.getpid()) > alone / 2
    finally:
        child.kill()
        child.wait()


def test_memory_growth_compares_the_last_third_with_the_first():
    trace = MemoryTrace(0)
    trace.samples = [100, 100, 120, 105, 110, 110]
    assert trace.growth == pytest.approx(0.10)
    assert trace.peak == 120
