"""ROC AUC of a timing classifier, and how likely a given AUC is by chance. Pure Python.

The classifier says "the guess was the victim's cached prefix" when its time
to first token is short, so AUC = P(TTFT of a true guess < TTFT of a decoy),
ties counting one half (the Mann-Whitney U statistic over m * n pairs).
0.5 means time tells nothing; 1.0 means every true guess was faster than
every decoy.
"""

from __future__ import annotations

from functools import lru_cache
from math import comb, erfc, sqrt

EXACT_UP_TO_PAIRS = 400  # beyond this the exact count is slow and the normal approximation is good


def auc_shorter_is_positive(positives: list[float], negatives: list[float]) -> float:
    if not positives or not negatives:
        raise ValueError("need at least one positive and one negative sample")
    wins = sum((p < n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


@lru_cache(maxsize=None)
def _arrangements(m: int, n: int, u: int) -> int:
    """Orderings of m positives among n negatives with exactly u (positive < negative) pairs."""
    if u < 0:
        return 0
    if m == 0 or n == 0:
        return int(u == 0)
    # The slowest sample is a positive (beats no decoy) or a negative (loses to all m positives).
    return _arrangements(m - 1, n, u) + _arrangements(m, n - 1, u - m)


def chance_of_at_least(auc: float, m: int, n: int) -> float:
    """P(AUC >= auc) when time carries no information (exchangeable samples, no ties)."""
    if m * n > EXACT_UP_TO_PAIRS:
        z = (auc - 0.5) / null_standard_error(m, n)
        return 0.5 * erfc(z / sqrt(2))
    least_u = -(-round(auc * m * n * 1e9) // 10**9)  # ceil without float fuzz
    return sum(_arrangements(m, n, u) for u in range(least_u, m * n + 1)) / comb(m + n, m)


def null_standard_error(m: int, n: int) -> float:
    """Standard deviation of the AUC when time carries no information."""
    return sqrt((m + n + 1) / (12 * m * n))
