"""The end-of-run report of `run-all`: PNG plots and a one-page summary.md.

Everything is rebuilt from files in the run folder (metrics.jsonl, eval/*.json), so the
report of a resumed run is the same as that of an uninterrupted one.
"""

from __future__ import annotations

import json
from pathlib import Path

from atomcli.stages import step_metrics as sm


def _evals(run_dir: Path, sub: str = "") -> list[dict]:
    reports = []
    for p in (run_dir / "eval" / sub).glob("*.json"):
        r = json.loads(p.read_text())
        r.setdefault("name", p.stem)
        reports.append(r)
    order = {"base": 0, "sft": 1}
    return sorted(reports, key=lambda r: (order.get(r["name"], 2), r["name"]))


def write(run_dir: Path, context=None) -> Path:
    run_dir = Path(run_dir)
    metrics = []
    if (run_dir / "metrics.jsonl").exists():
        metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = _evals(run_dir)
    from atomcli.stages.run_all import DEV, TRANSFER, describe_final
    transfer, dev = _evals(run_dir, TRANSFER), _evals(run_dir, DEV)
    plots = _plots(run_dir, metrics, evals)
    lines = ["# atomcli run summary", "", f"Run folder: `{run_dir}`", ""]
    final = describe_final(run_dir)
    if final:
        lines += [final, ""]
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
        lines += ["## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in plots] + [""]
    out = run_dir / "summary.md"
    from atomcli.tableio import write_bytes_atomic
    write_bytes_atomic(out, "\n".join(lines).encode())
    return out


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
    lines += ["", "Δ: paired difference over the same question ids with a 95% percentile bootstrap interval "
                  "(`atomcli/stages/compare.py`); an interval above 0 is a gain that resampling the questions "
                  "does not explain away.", ""]
    by_source = _by_source_table(reports)
    if by_source:
        lines += by_source
    return lines


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


def _plots(run_dir: Path, metrics: list[dict], evals: list[dict]) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = run_dir / "plots"
    out.mkdir(exist_ok=True)
    written = []
    if metrics:
        curves = [(k, label) for k, label in sm.CURVES if any(m.get(k) is not None for m in metrics)]
        if curves:
            n = len(curves)
            cols = 4
            rows = (n + cols - 1) // cols
            fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
            for ax, (k, label) in zip(axes.flat, curves):
                xs = [m["step"] for m in metrics if m.get(k) is not None]
                ys = [m[k] for m in metrics if m.get(k) is not None]
                ax.plot(xs, ys, marker="o")
                ax.set_title(label)
                ax.set_xlabel("step")
            for ax in list(axes.flat)[n:]:
                ax.axis("off")
            written.append(_save(plt, fig, out / "training.png"))
    if evals:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        names = [r["name"] for r in evals]
        ax.bar(names, [r.get("overall", {}).get("f1", 0) for r in evals])
        ax.set_ylabel("test F1")
        ax.set_title("eval F1 per checkpoint")
        written.append(_save(plt, fig, out / "eval_f1.png"))
    return written


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
