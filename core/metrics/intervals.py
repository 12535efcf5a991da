"""Confidence intervals for success rates: the Wilson score interval of a binomial proportion.

Why Wilson: success rates of policies are measured on tens of episodes, often at 0 % or 100 %, where the
normal-approximation (Wald) interval collapses to a single point; Wilson's stays inside [0, 1] and keeps
close to its nominal coverage at small ``n`` (Brown, Cai & DasGupta 2001). Wilson 1927's interval without a
continuity correction: the set of rates ``p`` whose score statistic ``|k/n - p| / sqrt(p (1 - p) / n)`` is at
most ``z``.
"""

from __future__ import annotations

import math

__all__ = ["wilson_interval"]


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of ``successes`` out of ``n`` Bernoulli trials.

    Args:
        successes: Number of successes, in ``0..n``.
        n: Number of trials (>= 0); ``n = 0`` says nothing and gives ``(0.0, 1.0)``.
        z: Standard-normal quantile of the two-sided level (1.96: 95 %).

    Returns:
        ``(lo, hi)`` as fractions in [0, 1], e.g. 5 / 10 -> (0.2366, 0.7634), 0 / 10 -> (0.0, 0.2775).

    Raises:
        ValueError: ``n < 0``, ``successes`` outside ``0..n`` or ``z <= 0``.
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= n, got {successes} of {n}")
    if not z > 0:
        raise ValueError(f"wilson_interval: z must be > 0, got {z}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi
