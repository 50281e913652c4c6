"""Statistics over seeds, standard library only: Student's t-interval of a mean (its quantile by bisection
on the closed-form coverage, so no table and no scipy), Wilson's interval of a share, and the paired
comparison of two configurations that share seeds."""

from __future__ import annotations

import math
import statistics

CONFIDENCE = 0.95
Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile: Wilson's interval at 95%


def _t_coverage(theta, df):
    """P(|T| <= sqrt(df) tan(theta)) for Student's t with integer df >= 1, in closed form (Abramowitz and
    Stegun 26.7.3-4): a finite sum of powers of cos(theta), odd and even df apart."""
    cos, sin = math.cos(theta), math.sin(theta)
    if df % 2 == 1:
        term, total = cos, cos if df > 1 else 0.0  # the sum cos + 2/3 cos^3 + (2*4)/(3*5) cos^5 + ...
        for k in range(3, df - 1, 2):
            term *= (k - 1) / k * cos * cos
            total += term
        return 2.0 / math.pi * (theta + sin * total)
    term = total = 1.0  # the sum 1 + 1/2 cos^2 + (1*3)/(2*4) cos^4 + ...
    for k in range(2, df - 1, 2):
        term *= (k - 1) / k * cos * cos
        total += term
    return sin * total


def t_quantile(df, level=CONFIDENCE):
    """The two-sided critical value t of Student's t with `df` degrees of freedom: P(|T| <= t) = level
    (12.706 for df 1, 2.776 for df 4, 2.262 for df 9). Found by bisection on the closed-form coverage,
    so no table and no scipy. Raises ValueError for df < 1 or level outside (0, 1)."""
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df: expected an integer >= 1, got {df!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: expected a number in (0, 1), got {level!r}")
    low, high = 0.0, math.pi / 2
    for _ in range(200):  # the coverage rises with theta from 0 to 1
        middle = (low + high) / 2
        if middle in (low, high):
            break
        low, high = (middle, high) if _t_coverage(middle, df) < level else (low, middle)
    return math.sqrt(df) * math.tan((low + high) / 2)


def mean_interval(values, level=CONFIDENCE):
    """(mean, low, high): the mean of `values` and its t-interval, mean -+ t * sample std / sqrt(n);
    low and high are None for fewer than 2 values (no spread to estimate)."""
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, None, None
    half = t_quantile(len(values) - 1, level) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def wilson_interval(successes, trials):
    """The 95% Wilson score interval (low, high) of a share `successes` of `trials` (Wilson 1927): unlike
    k/n -+ 1.96 se it stays inside [0, 1] and is not empty at 0 of n."""
    if trials == 0:
        return None, None
    share, z2 = successes / trials, Z_95 * Z_95
    centre = (share + z2 / (2 * trials)) / (1 + z2 / trials)
    half = Z_95 / (1 + z2 / trials) * math.sqrt(share * (1 - share) / trials + z2 / (4 * trials * trials))
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_differences(by_seed, metric, first, second):
    """{seed: first's metric - second's} over the seeds where both configurations have a value (a target
    metric is None for a run that never reached it: that seed is left out, not counted as -1)."""
    differences = {}
    for seed, runs in by_seed.items():
        a, b = runs[first][metric], runs[second][metric]
        if a is not None and b is not None:
            differences[seed] = a - b
    return differences


def paired_comparison(by_seed, metric, first, second):
    """The paired comparison of two configurations that share seeds: per-seed differences, their mean and
    95% t-interval, how many seeds have each sign, and how many seeds were left out (no value)."""
    differences = paired_differences(by_seed, metric, first, second)
    values = list(differences.values())
    mean, low, high = mean_interval(values) if values else (None, None, None)
    return {"metric": metric, "first": first, "second": second, "seeds": len(values),
            "left_out": len(by_seed) - len(values), "mean_difference": mean,
            "interval": None if low is None else [low, high],
            "first_greater": sum(value > 0 for value in values), "second_greater": sum(value < 0 for value in values),
            "per_seed": [{"seed": seed, "difference": value} for seed, value in differences.items()]}
