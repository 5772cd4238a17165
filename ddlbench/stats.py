"""Exact sign-test figures: the binomial tail at p = 1/2 and the distribution-free interval of
a median that follows from it (the findings check, the peers' paired rounds)."""
from __future__ import annotations

from math import comb

# The confidence at least of the interval around a median (``median_interval``).
CONFIDENCE = 0.95


def sign_tail(n: int, k: int) -> float:
    """P(B >= k) for B ~ Binomial(n, 1/2): the one-sided sign test's p of k or more of n."""
    return sum(comb(n, i) for i in range(max(k, 0), n + 1)) / 2 ** n


def median_interval(values: list[float], confidence: float = CONFIDENCE):
    """The distribution-free interval of the median of ``values`` (paired per-round ratios):
    order statistics k and n+1-k for the largest k at which a sign test keeps at least
    ``confidence`` (P(k <= B <= n-k) for B ~ Binomial(n, 1/2)); None for fewer than 6 values
    (no k reaches 95%)."""
    n = len(values)
    ranked = sorted(values)
    best = None
    for k in range(1, n // 2 + 1):
        # outside: P(B <= k-1) + P(B >= n-k+1), the two tails alike
        if 1.0 - 2 * sign_tail(n, n - k + 1) < confidence:
            break
        best = (ranked[k - 1], ranked[n - k])
    return best
