"""The end-of-run report of `run-all`: summary.md (what each stage did, whether the run beat its SFT, the evals and
the steps) and PNG plots.

Everything is rebuilt from files in the run folder (config.json, metrics.jsonl, eval/*.json, the stage folders),
so the report of a resumed run is the same as that of an uninterrupted one. It reads the folder; it never runs a
stage. A curve is drawn only where there are two points or more (a one-step run gets its table, not dots), and
eval differences are drawn with their paired interval.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from atomcli.errors import InputError
from atomcli.stages.run_all import layout
from atomcli.stages.run_all import step_metrics as sm

_ORDER = {"base": 0, "sft": 1}


def _evals(run_dir: Path, sub: str = "") -> list[dict]:
    reports = []
    for p in (run_dir / layout.EVAL / sub).glob("*.json"):
        r = json.loads(p.read_text())
        r.setdefault("name", p.stem)
        reports.append(r)
    return sorted(reports, key=lambda r: (_ORDER.get(r["name"], 2), r["name"]))


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _rows(path: Path) -> int | None:
    """A table's row count from its Parquet footer (None: no such table)."""
    if not path.is_file():
        return None
    import pyarrow.parquet as pq
    return pq.read_metadata(str(path)).num_rows


def write(run_dir: Path) -> Path:
    run_dir = Path(run_dir)
    metrics = []
    if (run_dir / layout.METRICS).exists():
        metrics = [json.loads(x) for x in (run_dir / layout.METRICS).read_text().splitlines() if x.strip()]
    settings = _json(run_dir / layout.CONFIG)
    evals = _evals(run_dir)
    transfer, dev = _evals(run_dir, layout.TRANSFER), _evals(run_dir, layout.DEV)
    plots = _plots(run_dir, metrics, evals)
    lines = ["# atomcli run summary", "", f"Run folder: `{run_dir}`", ""]
    lines += ["## What the run did", ""] + stages_done(run_dir, settings, metrics, evals, transfer, dev) + [""]
    lines += ["## Result", ""] + verdict(run_dir, settings, evals, transfer) + [""]
    for title, reports in (("Evaluation (test split)", evals),
                           ("Dev: held-out training questions (they choose the final checkpoint)", dev),
                           ("Transfer: real documents (test split of the real-text benchmark)", transfer)):
        if reports:
            lines += _eval_section(title, reports)
    if metrics:
        keys = [k for k in sm.TABLE if any(m.get(k) is not None for m in metrics)]
        lines += ["## Training steps", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        for m in metrics:
            lines.append("| " + " | ".join(_fmt(m.get(k)) for k in keys) + " |")
        lines.append("")
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}]({layout.PLOTS}/{p.name})" for p in plots] + [""]
    out = run_dir / layout.SUMMARY
    from atomcli.tableio import write_bytes_atomic
    write_bytes_atomic(out, "\n".join(lines).encode())
    return out


# --- what each stage did ------------------------------------------------------------------------------

def stages_done(run_dir: Path, settings: dict, metrics: list[dict], evals, transfer, dev) -> list[str]:
    """One bullet per stage the run went through, with what it read and wrote (from the folder's files)."""
    ra = settings.get("run-all") or {}
    out = []
    world = run_dir / layout.WORLD
    if (world / "train.jsonl").is_file():
        n_train = sum(1 for x in (world / "train.jsonl").read_text().splitlines() if x.strip())
        n_test = sum(1 for x in (world / "test.jsonl").read_text().splitlines() if x.strip()) \
            if (world / "test.jsonl").is_file() else 0
        out.append(f"- **World**: built the demo world in `{layout.WORLD}/` ({ra.get('world_style', 'classic')} "
                   f"style: {n_train} training and {n_test} test questions, a local search index, the expert's "
                   f"SFT trajectories).")
    sft = run_dir / layout.SFT
    if (sft / "config.json").is_file():
        m = _json(sft / "metrics.json")
        loss = (f" (loss {m['train_loss_first']:.3f} at the first, {m['train_loss_last']:.3f} at the last)"
                if isinstance(m.get("train_loss_first"), (int, float)) and
                isinstance(m.get("train_loss_last"), (int, float)) else "")
        out.append(f"- **SFT**: fine-tuned `{ra.get('model', 'smollm2')}` on {m.get('rows', '?')} expert "
                   f"trajectories for {m.get('steps', '?')} optimizer steps{loss}: `{layout.SFT}/`.")
    for d in sorted((run_dir / layout.RFT_ROOT).glob("[0-9][0-9]")):
        q, roll, kept, rows = (_rows(d / f"{t}.parquet") for t in ("questions", "rollouts", "kept", "rows"))
        if q is None:
            continue
        what = f"- **Rejection sampling, round {int(d.name)}**: sampled {roll if roll is not None else '?'} " \
               f"answers to {q} training questions"
        if kept is None:
            what += "; none was right, so the rounds stopped."
        else:
            point = f"rft-{d.name}"
            evaluated = f" (eval {point})" if (run_dir / layout.EVAL / f"{point}.json").is_file() else ""
            what += (f", kept {kept} right ones (`atom rft`); tuned the SFT checkpoint one epoch on the {rows} kept "
                     f"rows of rounds 1-{int(d.name)}: `{layout.RFT_ROOT}/{d.name}/ckpt`{evaluated}.")
        out.append(what)
    if (run_dir / layout.RFT_ROOT / layout.SOUP / "ckpt" / "config.json").is_file():
        out.append(f"- **Soup**: averaged the rounds' checkpoints weight by weight: "
                   f"`{layout.RFT_ROOT}/{layout.SOUP}/ckpt` (eval {layout.SOUP_POINT}).")
    if metrics:
        first = run_dir / layout.STEPS / "0001"
        q, roll = _rows(first / "questions.parquet"), _rows(first / "rollouts.parquet")
        scorer = "score-ig" if ((settings.get("aggregate-reward") or {}).get("process") == "ig") else "score-rrm"
        size = f" of {q} questions x {roll // q} samples" if q and roll else ""
        reward = [m.get(sm.REWARD_MEAN) for m in metrics]
        moved = (f"; mean reward {reward[0]:.3f} at step 1, {reward[-1]:.3f} at step {len(reward)}"
                 if len(reward) >= 2 and None not in (reward[0], reward[-1]) else "")
        out.append(f"- **GRPO**: {len(metrics)} step{'s' if len(metrics) != 1 else ''}{size}, each rollout -> "
                   f"{scorer} -> aggregate-reward -> grpo-step{moved}: `{layout.STEPS}/NNNN/`.")
    for title, reports in (("test", evals), ("dev", dev), ("transfer", transfer)):
        if reports:
            n = (reports[0].get("overall") or {}).get("n", reports[0].get("n", "?"))
            out.append(f"- **Evals ({title})**: {', '.join(r['name'] for r in reports)} on {n} questions, greedy.")
    return out or ["- nothing yet"]


def final_point(run_dir: Path, evals: list[dict]) -> str | None:
    """The eval point of the run's final checkpoint: final.json's choice, else the last stage's."""
    final = _json(run_dir / layout.FINAL_FILE)
    if final.get("name"):
        return final["name"]
    names = [r["name"] for r in evals]
    steps = sorted(n for n in names if re.fullmatch(r"step-\d{4}", n))
    rounds = sorted(n for n in names if re.fullmatch(r"rft-\d{2}", n))
    for pick in (steps[-1:], [layout.SOUP_POINT] if layout.SOUP_POINT in names else [], rounds[-1:],
                 [n for n in ("sft", "base") if n in names][:1]):
        if pick:
            return pick[0]
    return None


def verdict(run_dir: Path, settings: dict, evals: list[dict], transfer: list[dict]) -> list[str]:
    """Whether the final checkpoint beat its SFT on each split, with the paired 95% interval."""
    name = final_point(run_dir, evals)
    if name is None:
        return ["No eval has finished yet."]
    lines = []
    final = _json(run_dir / layout.FINAL_FILE)
    if final.get("name"):
        lines.append(f"Final checkpoint: **{final['name']}** (`{final['checkpoint']}`): the best dev F1 "
                     f"({final['dev_f1']:.3f}) of {len(final['candidates'])} eval points on "
                     f"{final['dev_questions']} held-out training questions; its test F1 is {final['test_f1']:.3f}.")
    else:
        lines.append(f"Final checkpoint: **{name}** (the last stage's).")
    if name in ("sft", "base"):
        return lines + ["", "Nothing was trained after the SFT, so there is no gain over it to report."]
    seed = int((settings.get("run-all") or {}).get("seed", 0) or 0)
    for split, reports in (("test split", evals), ("transfer split (real documents)", transfer)):
        by = {r["name"]: r for r in reports}
        base = "sft" if "sft" in by else ("base" if "base" in by else None)
        if name not in by or base is None or base == name:
            continue
        lines += ["", _against(by[name], by[base], name, base, split, seed)]
    lines += ["", "The interval is the 95% percentile bootstrap interval of the paired difference over the same "
                  "questions: above 0 is a gain that resampling the questions does not explain away."]
    return lines


def _against(new: dict, base: dict, name: str, base_name: str, split: str, seed: int) -> str:
    from atomcli.stages import compare
    c = new.get("compare") if (new.get("compare") or {}).get("baseline") == base_name else None
    if c is None:
        try:
            c = compare.compare_reports(new, base, baseline_name=base_name, seed=seed)
        except InputError as e:  # reports without per-question scores: say so, keep the report
            return f"On the {split}: {name} cannot be compared with {base_name} ({e})."
    f1 = c["overall"]["f1"]
    if f1.get("diff") is None:
        return f"On the {split}: {name} and {base_name} share no question."
    if f1["low"] > 0:
        word = f"**{name} beat {base_name}**"
    elif f1["high"] < 0:
        word = f"**{name} is worse than {base_name}**"
    else:
        word = f"**no difference the questions can tell apart** between {name} and {base_name}"
    who = "its SFT" if base_name == "sft" else "the starting model"
    return (f"On the {split}: {word} ({who}): F1 {f1['base']:.3f} -> {f1['new']:.3f}, "
            f"ΔF1 {compare.describe(f1)} over {f1['n']} questions.")


# --- tables ------------------------------------------------------------------------------------------

def _eval_section(title: str, reports: list[dict]) -> list[str]:
    from atomcli.stages.compare import describe
    first = reports[0]["name"]
    lines = [f"## {title}", "",
             f"| checkpoint | F1 | EM | cover-EM | ΔF1 vs {first} [95% CI] | ΔEM vs {first} [95% CI] "
             "| format errors | searches/q | n |", "|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        o = r.get("overall", {})
        c = (r.get("compare") or {}).get("overall", {})
        lines.append(f"| {r['name']} | {o.get('f1', 0):.3f} | {o.get('em', 0):.3f} | {o.get('cover_em', 0):.3f} | "
                     f"{describe(c.get('f1'))} | {describe(c.get('em'))} | "
                     f"{o.get('format_error_rate') or 0:.3f} | "
                     f"{o.get('searches_per_question', 0) or 0:.2f} | {o.get('n', r.get('n', ''))} |")
    lines += ["", "Δ: paired difference over the same questions with a 95% percentile bootstrap interval "
                  "(`atomcli/stages/compare.py`).", ""]
    return lines + _by_source_table(reports)


def _by_source_table(evals: list[dict]) -> list[str]:
    """F1 per data_source and checkpoint (where learning happens, or does not)."""
    sources = sorted({src for r in evals for src in (r.get("by_source") or {})})
    if len(sources) < 2:
        return []
    lines = ["| checkpoint | " + " | ".join(sources) + " |", "|---|" + "---|" * len(sources)]
    for r in evals:
        bs = r.get("by_source") or {}
        lines.append(f"| {r['name']} | " + " | ".join(_fmt((bs.get(s) or {}).get("f1")) for s in sources) + " |")
    return ["F1 by data_source:", ""] + lines + [""]


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


# --- pictures ----------------------------------------------------------------------------------------

def curves(metrics: list[dict]) -> list[tuple[str, str]]:
    """The training curves worth drawing: (key, title) of every metric with two steps or more."""
    return [(k, label) for k, label in sm.CURVES if sum(m.get(k) is not None for m in metrics) >= 2]


def _plots(run_dir: Path, metrics: list[dict], evals: list[dict]) -> list[Path]:
    drawn = curves(metrics)
    if not drawn and not evals:
        return []
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = run_dir / layout.PLOTS
    out.mkdir(exist_ok=True)
    written = []
    if drawn:
        cols = min(4, len(drawn))
        rows = (len(drawn) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
        for ax, (k, label) in zip(axes.flat, drawn):
            xs = [m["step"] for m in metrics if m.get(k) is not None]
            ys = [m[k] for m in metrics if m.get(k) is not None]
            ax.plot(xs, ys, marker="o")
            ax.set_title(label)
            ax.set_xlabel("step")
        for ax in list(axes.flat)[len(drawn):]:
            ax.axis("off")
        written.append(_save(plt, fig, out / "training.png"))
    if evals:
        written.append(_eval_chart(plt, evals, out / "eval_f1.png"))
    return written


def _eval_chart(plt, evals: list[dict], path: Path) -> Path:
    """Test F1 per checkpoint and, where the reports have them, the paired differences from the first eval
    with their 95% intervals as error bars."""
    names = [r["name"] for r in evals]
    diffs = [((r.get("compare") or {}).get("overall") or {}).get("f1") or {} for r in evals]
    with_ci = [(n, d) for n, d in zip(names, diffs) if d.get("diff") is not None and d.get("low") is not None]
    fig, axes = plt.subplots(1, 2 if with_ci else 1, figsize=(11 if with_ci else 6, 3.5), squeeze=False)
    ax = axes[0][0]
    ax.bar(names, [(r.get("overall") or {}).get("f1", 0) or 0 for r in evals])
    ax.set_ylabel("test F1")
    ax.set_title("eval F1 per checkpoint")
    if with_ci:
        ax = axes[0][1]
        ys = [d["diff"] for _, d in with_ci]
        err = [[d["diff"] - d["low"] for _, d in with_ci], [d["high"] - d["diff"] for _, d in with_ci]]
        ax.bar([n for n, _ in with_ci], ys, yerr=err, capsize=4)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_ylabel(f"ΔF1 vs {names[0]}")
        ax.set_title("paired ΔF1 with 95% interval")
    return _save(plt, fig, path)


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
