"""Paired comparison of two evaluations of the same questions: differences with a bootstrap interval.

`eval --compare BASELINE` and run-all's summary use this so that nobody has to eyeball two F1
numbers. Both sides are per-question scores (a question's value is the mean over its samples,
exactly as in the report). Only questions present on both sides count; the pairing is by
question id. The interval is the percentile 95% interval of the mean difference over
`n_boot` resamples of question ids with replacement (seeded: the same inputs give the same
interval). Per `data_source` and overall; a source's resamples stay inside the source.

Pure: no I/O. The caller reads the baseline (a report JSON with `per_question`, or an
answered table scored by `evaluate.score_table`).
"""

from __future__ import annotations

import math
import random

from atomcli.errors import InputError

COMPARED = ("f1", "em")   # metrics compared, in report order
N_BOOT = 10_000
LEVEL = 0.95


def paired(new: dict, base: dict, *, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """Mean of new[i] - base[i] over shared ids, with a percentile bootstrap interval."""
    ids = sorted(set(new) & set(base))
    diffs = [float(new[i]) - float(base[i]) for i in ids]
    n = len(diffs)
    if not n:
        return {"n": 0, "diff": None, "low": None, "high": None, "p_le_0": None}
    mean = math.fsum(diffs) / n
    rng = random.Random(seed)
    boots = sorted(math.fsum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(n_boot))
    lo = boots[int(math.floor((1 - LEVEL) / 2 * (n_boot - 1)))]
    hi = boots[int(math.ceil((1 + LEVEL) / 2 * (n_boot - 1)))]
    # share of resamples with no gain: a one-sided bootstrap p-value for "new is better"
    p = sum(b <= 0 for b in boots) / n_boot
    return {"n": n, "new": math.fsum(new[i] for i in ids) / n, "base": math.fsum(base[i] for i in ids) / n,
            "diff": mean, "low": lo, "high": hi, "p_le_0": p}


def compare_reports(new: dict, base: dict, *, baseline_name: str = "baseline", n_boot: int = N_BOOT,
                    seed: int = 0) -> dict:
    """The `compare` block of a report: `new` and `base` are reports with `per_question`."""
    pn, pb = _per_question(new, "the new report"), _per_question(base, baseline_name)
    shared = set(pn) & set(pb)
    if not shared:
        raise InputError(f"{baseline_name} has no question id in common with this evaluation",
                         hint="compare evaluations of the same question file")
    if new.get("f1_variant") and base.get("f1_variant") and new["f1_variant"] != base["f1_variant"]:
        raise InputError(f"{baseline_name} was scored with F1 `{base['f1_variant']}`, this one with "
                         f"`{new['f1_variant']}`", hint="pass the same --f1 to both evaluations")
    sources = sorted({pn[i]["source"] for i in shared})
    out = {"baseline": baseline_name, "level": LEVEL, "n_boot": n_boot, "n_shared": len(shared),
           "only_new": len(set(pn) - shared), "only_baseline": len(set(pb) - shared),
           "overall": {}, "by_source": {s: {} for s in sources}}
    for metric in COMPARED:
        out["overall"][metric] = paired({i: pn[i][metric] for i in shared}, {i: pb[i][metric] for i in shared},
                                        n_boot=n_boot, seed=seed)
        for s in sources:
            ids = [i for i in shared if pn[i]["source"] == s]
            out["by_source"][s][metric] = paired({i: pn[i][metric] for i in ids}, {i: pb[i][metric] for i in ids},
                                                 n_boot=n_boot, seed=seed)
    return out


def _per_question(report: dict, name: str) -> dict:
    pq = report.get("per_question")
    if not isinstance(pq, dict) or not pq:
        raise InputError(f"{name} has no per-question scores (`per_question`)",
                         hint="compare with a report written by this version of `atom eval`, or with the answered table")
    return pq


def describe(c: dict | None) -> str:
    """One line for people: `+0.062 [+0.021, +0.104]`."""
    if c is None or c.get("diff") is None:
        return "–"
    return f"{c['diff']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]"
