"""Paired comparison of two evaluations of the same questions: differences with a bootstrap interval.

`eval --compare BASELINE`, the eval history's time series and run-all's summary use this so that
nobody has to eyeball two F1 numbers. Both sides are per-question scores (a question's value is
the mean over its samples, exactly as in the report). Only questions present on both sides
count, and only when they are the same question: the pairing is by question id, and a shared
id whose question text, golden answers or `data_source` differ (each compared where both sides
record it) is left out and counted (`mismatched`); when no shared id is the same question the
comparison is refused. The interval is the percentile 95% interval of the mean difference over
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
SOURCE, QUESTION, GOLDS = "source", "question_digest", "golds_digest"  # a per_question entry's identity keys
IDENTITY = ((QUESTION, "question text"), (GOLDS, "golden answers"), (SOURCE, "data_source"))
NO_SOURCE = "unknown"  # evaluate.UNKNOWN_SOURCE: a table without data_source records none


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


def same_question(a: dict, b: dict) -> str | None:
    """None when two per_question entries of one id are the same question, else what differs
    (each identity key is compared only where both entries record it)."""
    for key, what in IDENTITY:
        x, y = a.get(key), b.get(key)
        if key == SOURCE and NO_SOURCE in (x, y):
            continue
        if x is not None and y is not None and x != y:
            return what
    return None


def identity_keys(a: dict, b: dict) -> list[str]:
    """What two per_question tables were paired on: the id, and every identity key both record throughout."""
    names = ["id"]
    for key, what in IDENTITY:
        if all(a[i].get(key) not in (None, NO_SOURCE) and b[i].get(key) not in (None, NO_SOURCE)
               for i in set(a) & set(b)):
            names.append(what)
    return names


def compare_reports(new: dict, base: dict, *, baseline_name: str = "baseline", n_boot: int = N_BOOT,
                    seed: int = 0, metrics: tuple[str, ...] = COMPARED) -> dict:
    """The `compare` block of a report: `new` and `base` are reports (or eval history lines) with `per_question`."""
    pn, pb = _per_question(new, "the new report", metrics), _per_question(base, baseline_name, metrics)
    ids, differ = pairing(pn, pb, baseline_name, new.get("f1_variant"), base.get("f1_variant"))
    shared = ids - set(differ)
    sources = sorted({pn[i].get(SOURCE, NO_SOURCE) for i in shared})
    out = {"baseline": baseline_name, "level": LEVEL, "n_boot": n_boot, "n_shared": len(shared),
           "only_new": len(set(pn) - ids), "only_baseline": len(set(pb) - ids),
           "mismatched": len(differ), "mismatched_ids": list(differ)[:10],
           "paired_on": identity_keys({i: pn[i] for i in shared}, {i: pb[i] for i in shared}),
           "overall": {}, "by_source": {s: {} for s in sources}}
    for metric in metrics:
        out["overall"][metric] = paired({i: pn[i][metric] for i in shared}, {i: pb[i][metric] for i in shared},
                                        n_boot=n_boot, seed=seed)
        for s in sources:
            sub = [i for i in shared if pn[i].get(SOURCE, NO_SOURCE) == s]
            out["by_source"][s][metric] = paired({i: pn[i][metric] for i in sub}, {i: pb[i][metric] for i in sub},
                                                 n_boot=n_boot, seed=seed)
    return out


def pairing(pn: dict, pb: dict, baseline_name: str, new_variant: str | None = None,
            base_variant: str | None = None) -> tuple[set, dict]:
    """(the shared ids, {shared id: what differs} for those that name another question); refuses a baseline
    with no id in common, one scored with another F1, or one none of whose shared ids is the same question.
    `pn` needs only the identity keys, so the questions can be checked before they are rolled out."""
    ids = set(pn) & set(pb)
    if not ids:
        raise InputError(f"{baseline_name} has no question id in common with this evaluation",
                         hint="compare evaluations of the same question file")
    if new_variant and base_variant and new_variant != base_variant:
        raise InputError(f"{baseline_name} was scored with F1 `{base_variant}`, this one with `{new_variant}`",
                         hint="pass the same --f1 to both evaluations")
    differ = {i: d for i in sorted(ids, key=str) if (d := same_question(pn[i], pb[i]))}
    if len(differ) == len(ids):
        first = next(iter(differ))
        raise InputError(f"{baseline_name} shares {len(ids)} question id(s) with this evaluation, but none is the "
                         f"same question (id `{first}`: the {differ[first]} differs)",
                         hint="compare evaluations of the same question file")
    return ids, differ


def check_baseline(questions: dict, base: dict, baseline_name: str, variant: str | None = None) -> None:
    """Refuse a baseline before any rollout: its scores must be numbers and some of its questions these ones
    (`questions`: identity keys per id, evaluate.identities)."""
    pairing(questions, _per_question(base, baseline_name), baseline_name, variant, base.get("f1_variant"))


def _per_question(report: dict, name: str, metrics: tuple[str, ...] = COMPARED) -> dict:
    pq = report.get("per_question")
    if not isinstance(pq, dict) or not pq:
        raise InputError(f"{name} has no per-question scores (`per_question`)",
                         hint="compare with a report written by this version of `atom eval`, or with the answered table")
    for qid, entry in pq.items():
        if not isinstance(entry, dict):
            raise InputError(f"question `{qid}` has no scores (its `per_question` entry is "
                             f"{type(entry).__name__}, not an object)", file=name,
                             hint="give a report written by `atom eval`")
        for metric in metrics:
            value = entry.get(metric)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                shown = "missing" if metric not in entry else "null" if value is None else repr(value)[:40]
                raise InputError(f"question `{qid}` has `{metric}` {shown}, not a number", file=name,
                                 hint="give a report written by `atom eval`, or the answered table itself")
    return pq


def describe(c: dict | None) -> str:
    """One line for people: `+0.062 [+0.021, +0.104]`."""
    if c is None or c.get("diff") is None:
        return "–"
    return f"{c['diff']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]"
