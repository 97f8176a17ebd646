"""The files of `atom eval`: read the input, write the JSON / Markdown reports and the history.

`evaluate.run` computes the report; this module owns everything around it. The JSON report
is written atomically (`-` = stdout, data only), the people-facing table goes to stderr,
`--markdown` writes the same table as Markdown, and `--history` appends one compact JSON
line per run so that cron jobs build a time series with nothing but `>>` semantics.
Bad input fails before anything is written.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import orjson

from atomcli import plugins, tableio
from atomcli.errors import InputError

PERCENT = ("f1", "em", "cover_em", "best_f1", "judge_accuracy", "format_error_rate")
# (report key, Markdown title, terminal title); rates are shown as percentages like the papers' tables.
COLUMNS = [("n", "n", "n"), ("f1", "F1", "F1"), ("em", "EM", "EM"), ("cover_em", "cover-EM", "cover"),
           ("best_f1", "best F1", "best"), ("judge_accuracy", "judge", "judge"),
           ("format_error_rate", "format err", "fmt"), ("mean_turns", "turns", "turns"),
           ("searches_per_question", "searches", "srch"), ("browses_per_question", "browses", "brws"),
           ("tokens_per_question", "tokens", "tok")]


def run_to_files(mod, input_path: str, cfg, ctx, *, out: str, markdown: str | None = None,
                 history: str | None = None, compare: str | None = None, answers: str | None = None) -> dict:
    """Read INPUT, evaluate, write the reports (and with `answers`, the rolled-out table); returns the report."""
    if [out, markdown, answers].count("-") > 1:
        raise InputError("only one of --out, --markdown, --answers can be `-` (stdout)",
                         hint="give the others file names")
    from atomcli import safety
    # the reports never land on the input, the baseline, the model folder or each other
    safety.check_outputs({"--out": out, "--markdown": markdown, "--history": history, "--answers": answers},
                         inputs=[input_path, compare, getattr(cfg, "model", None)])
    baseline = read_baseline(compare, cfg.f1) if compare else None  # a bad baseline fails before any rollout
    if cfg.judge:  # unknown names fail before any data or model loads
        plugins.check_judge_spec(cfg.judge)
    name = "<stdin>" if input_path == "-" else input_path
    table = tableio.read_table(input_path)
    if answers and (not cfg.model or "answer" in table.column_names):
        raise InputError("--answers writes the table this eval rolls out: it needs questions and --model",
                         file=name, hint="drop --answers (the input is already an answered table), or add --model")
    if cfg.model and "answer" not in table.column_names:
        plugins.check_search_spec(mod.rollout_config(cfg).search)
    try:
        rows, rolled_out = mod.answered(table, cfg, ctx)
        report = mod.finish_report(rows, cfg, ctx, rolled_out=rolled_out)
    except InputError as e:
        raise e.located(file=name) from None
    report = {"input": name, **report}
    if baseline is not None:
        from atomcli.stages import compare as cmp
        try:
            report["compare"] = cmp.compare_reports(report, baseline, baseline_name=compare, seed=cfg.seed)
        except InputError as e:
            raise e.located(file=compare) from None

    if answers:  # the transcripts behind the report, as `atom rollout` would have written them
        tableio.write_stage(rows, answers, "rollout", mod.rollout_config(cfg))
    _emit(out, to_json(report))
    if markdown:
        _emit(markdown, to_markdown(report).encode())
    if history:
        append_history(Path(history), report)
    if not ctx.quiet:
        ctx.console.print(rich_table(report))
        if "compare" in report:
            ctx.console.print(compare_table(report["compare"]))
    for path in (answers, out, markdown, history):
        if path and path != "-":
            ctx.log(f"[green]wrote[/] {path}")
    return report


def read_baseline(path: str, f1_variant: str) -> dict:
    """The baseline of `--compare`: a report JSON of `atom eval`, or an answered table (scored here)."""
    from atomcli.stages import evaluate
    p = Path(path)
    if not p.is_file():
        raise InputError("baseline not found", file=path, hint="give a report JSON or an answered rollout table")
    data = p.read_bytes()
    try:  # a report is one JSON object; a JSONL table is several (and fails to parse as one)
        report = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        if p.suffix == ".json":
            raise InputError(f"not a JSON report ({e})", file=path) from None
        report = None
    if isinstance(report, dict) and "overall" in report:
        return report
    table = tableio.read_table(path)
    try:
        return evaluate.score_table(table, f1_variant)
    except InputError as e:
        raise e.located(file=path) from None


def to_json(report: dict) -> bytes:
    return orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


def history_record(report: dict) -> dict:
    """The compact line appended per run: when, what, which model, the overall numbers."""
    return {"time": report.get("time"), "input": report.get("input"), "model": report.get("model"),
            "f1_variant": report.get("f1_variant"), "judge": (report.get("config") or {}).get("judge") or None,
            "n": report.get("n"), "overall": report.get("overall"),
            "f1_by_source": {src: m.get("f1") for src, m in (report.get("by_source") or {}).items()}}


def append_history(path: Path, report: dict) -> None:
    """Append one line with a single write(2) on an O_APPEND descriptor, so concurrent cron
    jobs interleave whole lines, never fragments."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = orjson.dumps(history_record(report), option=orjson.OPT_APPEND_NEWLINE)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _emit(path: str, data: bytes) -> None:
    """Write atomically, or to stdout for `-`."""
    if path == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        tableio.write_bytes_atomic(Path(path), data)


# --- people-facing renderings -----------------------------------------------------------------

def _visible_columns(report: dict) -> list[tuple[str, str, str]]:
    overall = report["overall"]
    cols = []
    for key, title, short in COLUMNS:
        if key == "best_f1" and overall.get("samples_per_question", 1) <= 1:
            continue  # identical to F1 with one sample per question
        if key != "n" and overall.get(key) is None:
            continue  # column absent from the input (or no judge)
        cols.append((key, title, short))
    return cols


def fmt(key: str, value) -> str:
    if value is None:
        return "-"
    if key in PERCENT:
        return f"{100 * value:.1f}"
    if key in ("n", "tokens_per_question"):
        return f"{value:.0f}"
    return f"{value:.2f}"


def _rows(report: dict) -> list[tuple[str, dict]]:
    return list(report["by_source"].items()) + [("overall", report["overall"])]


def scorer_line(report: dict) -> str:
    """Which official scorer each number comes from (`F1 = squad: SQuAD v1.1 token F1 ...`)."""
    from atomcli.rewards.metrics import SCORERS
    names = report.get("scorers") or {}
    return "; ".join(f"{k} = {v} ({SCORERS.get(v, v)})" for k, v in names.items()) or "-"


def rich_table(report: dict):
    from rich import box
    from rich.table import Table

    cols = _visible_columns(report)
    title = f"eval: {report.get('input', '')}" + (f"  model {report['model']}" if report.get("model") else "")
    table = Table(title=title, caption="F1, EM, cover(-EM), best (F1 of a group), judge, fmt (format errors) in %; "
                                       "turns, srch (searches), brws (browses), tok (tokens) per question\n"
                                       f"scorers: {scorer_line(report)}",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    rows = _rows(report)
    # source names matter more than wide headers when the terminal (or a CI log) is narrow
    table.add_column("source", min_width=min(24, max(len(src) for src, _ in rows)))
    for _, _, short in cols:
        table.add_column(short, justify="right")
    for i, (src, m) in enumerate(rows):
        table.add_row(src, *(fmt(k, m.get(k)) for k, _, _ in cols), style="bold" if i == len(rows) - 1 else None,
                      end_section=i == len(rows) - 2)
    return table


def compare_table(c: dict):
    """Differences against the baseline with their paired bootstrap intervals."""
    from rich import box
    from rich.table import Table

    from atomcli.stages.compare import COMPARED, describe
    table = Table(title=f"vs {c['baseline']} ({c['n_shared']} shared questions; paired bootstrap "
                        f"{100 * c['level']:.0f}% interval)", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("source")
    for m in COMPARED:
        table.add_column(f"Δ {m}", justify="right")
    rows = list(c["by_source"].items()) + [("overall", c["overall"])]
    for i, (src, vals) in enumerate(rows):
        table.add_row(src, *(describe(vals.get(m)) for m in COMPARED), style="bold" if i == len(rows) - 1 else None)
    return table


def compare_markdown(c: dict) -> list[str]:
    from atomcli.stages.compare import COMPARED, describe
    lines = ["", f"## Against `{c['baseline']}`", "",
             f"Paired over {c['n_shared']} shared question ids; {100 * c['level']:.0f}% percentile bootstrap "
             f"interval of the mean difference ({c['n_boot']} resamples).", "",
             "| data_source | " + " | ".join(f"Δ {m}" for m in COMPARED) + " |", "|---|" + "---:|" * len(COMPARED)]
    for src, vals in list(c["by_source"].items()) + [("**overall**", c["overall"])]:
        lines.append(f"| {src} | " + " | ".join(describe(vals.get(m)) for m in COMPARED) + " |")
    return lines


def to_markdown(report: dict) -> str:
    cols = _visible_columns(report)
    cfg = report.get("config") or {}
    lines = ["# atom eval report", "",
             f"- input: `{report.get('input')}`",
             f"- model: `{report.get('model')}`",
             f"- time: {report.get('time')}",
             f"- questions: {report.get('n')}, trajectories: {report.get('n_trajectories')}",
             f"- F1 variant: {report.get('f1_variant')}" + (f"; judge: `{cfg['judge']}`" if cfg.get("judge") else ""),
             f"- scorers: {scorer_line(report)}",
             "",
             "| data_source | " + " | ".join(t for _, t, _ in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for src, m in _rows(report):
        name = f"**{src}**" if src == "overall" else src.replace("|", "\\|")
        lines.append(f"| {name} | " + " | ".join(fmt(k, m.get(k)) for k, _, _ in cols) + " |")
    lines += ["", "F1, EM, cover-EM, best F1 (max over a question's samples), judge accuracy and the format-error "
                  "rate are percentages; a question's value is the mean over its samples, a row's the mean over "
                  "its questions. Turns, searches, browses and tokens are per question."]
    judge_errors = report["overall"].get("judge_errors")
    if judge_errors:
        lines.append(f"\nThe judge gave no verdict for {judge_errors} answer(s); they are left out of judge accuracy.")
    if "compare" in report:
        lines += compare_markdown(report["compare"])
    return "\n".join(lines) + "\n"
