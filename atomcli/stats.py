"""The few statistics every stage reports: mean and population standard deviation over the finite values.

One definition, so that a reward mean in aggregate-reward's summary, grpo-step's metrics, the
run's metrics.jsonl and an eval report are the same number. None and NaN/inf are left out (a
missing or failed value is not a zero); sums use math.fsum, so row order cannot change a bit.
"""

from __future__ import annotations

import math


def finite(xs) -> list[float]:
    out = []
    for x in xs:
        if x is None or isinstance(x, str):
            continue
        x = float(x)
        if math.isfinite(x):
            out.append(x)
    return out


def mean(xs) -> float | None:
    vals = finite(xs)
    return math.fsum(vals) / len(vals) if vals else None


def mean_std(xs) -> tuple[float | None, float | None]:
    """(mean, population std) of the finite values; (None, None) when there are none."""
    vals = finite(xs)
    if not vals:
        return None, None
    m = math.fsum(vals) / len(vals)
    return m, math.sqrt(math.fsum((x - m) ** 2 for x in vals) / len(vals))
