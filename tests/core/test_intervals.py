"""``core.metrics.wilson_interval``: known values, the score-test definition, edge cases."""

from __future__ import annotations

import math

import pytest

from core.metrics import wilson_interval


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [(0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (50, 50, 0.9287, 1.0), (10, 10, 0.7225, 1.0),
     (1, 3, 0.0615, 0.7923), (45, 50, 0.7864, 0.9565)],
)
def test_known_values(k, n, lo, hi):
    got = wilson_interval(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)  # the values are rounded to 4 places


@pytest.mark.parametrize(("k", "n"), [(1, 7), (3, 10), (17, 50), (49, 50), (123, 500)])
def test_ends_are_the_roots_of_the_score_test(k, n):
    lo, hi = wilson_interval(k, n)
    p_hat = k / n
    for p in (lo, hi):
        assert abs(p_hat - p) / math.sqrt(p * (1 - p) / n) == pytest.approx(1.96, rel=1e-9)
    assert lo < p_hat < hi
    lo99, hi99 = wilson_interval(k, n, z=2.576)
    assert lo99 < lo and hi < hi99  # a higher level is a wider interval


def test_edges_and_bad_input():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 1)[0] == 0.0 and wilson_interval(1, 1)[1] == 1.0
    for k, n in [(-1, 5), (6, 5), (0, -1)]:
        with pytest.raises(ValueError, match="successes"):
            wilson_interval(k, n)
    with pytest.raises(ValueError, match="z"):
        wilson_interval(1, 2, z=0)
