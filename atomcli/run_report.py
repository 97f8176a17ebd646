"""The end-of-run report of `run-all`: PNG plots and a one-page summary.md.

Everything is rebuilt from files in the run folder (metrics.jsonl, eval/*.json), so the
report of a resumed run is the same as that of an uninterrupted one.
"""

from __future__ import annotations

import json
from pathlib import Path

CURVES = [("reward_mean", "reward"), ("f1", "F1"), ("atr", "ATR"), ("alpha", "alpha"), ("kl", "KL"),
          ("clip_frac", "clip fraction"), ("format_error", "format errors"), ("searches", "searches / trajectory")]


def _evals(run_dir: Path) -> list[dict]:
    reports = []
    for p in (run_dir / "eval").glob("*.json"):
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
    plots = _plots(run_dir, metrics, evals)
    lines = ["# atomcli run summary", "", f"Run folder: `{run_dir}`", ""]
    if evals:
        lines += ["## Evaluation (test split)", "", "| checkpoint | F1 | EM | cover-EM | format errors | searches/q | n |",
                  "|---|---|---|---|---|---|---|"]
        for r in evals:
            o = r.get("overall", {})
            lines.append(f"| {r['name']} | {o.get('f1', 0):.3f} | {o.get('em', 0):.3f} | {o.get('cover_em', 0):.3f} | "
                         f"{o.get('format_error_rate', o.get('format_error', 0)):.3f} | "
                         f"{o.get('searches_per_question', 0) or 0:.2f} | {o.get('n', r.get('n', ''))} |")
        lines.append("")
    if metrics:
        keys = ["step", "alpha", "reward_mean", "f1", "atr", "format_error", "searches", "kl", "clip_frac", "loss"]
        keys = [k for k in keys if any(k in m for m in metrics)]
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
        curves = [(k, label) for k, label in CURVES if any(m.get(k) is not None for m in metrics)]
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
            fig.tight_layout()
            path = out / "training.png"
            fig.savefig(path, dpi=80)
            plt.close(fig)
            written.append(path)
    if evals:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        names = [r["name"] for r in evals]
        ax.bar(names, [r.get("overall", {}).get("f1", 0) for r in evals])
        ax.set_ylabel("test F1")
        ax.set_title("eval F1 per checkpoint")
        fig.tight_layout()
        path = out / "eval_f1.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written
