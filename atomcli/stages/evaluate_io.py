"""The files of `atom eval`: read the input, write the JSON / Markdown reports and the history.

`evaluate.run` computes the report; this module owns everything around it. The JSON report
is written atomically (`-` = stdout, data only), the people-facing table goes to stderr,
`--markdown` writes the same table as Markdown, and `--history` appends one JSON line per run
(eval_history.py: checkpoint, version, settings digest, per-question scores) under a lock, so
that cron jobs build a time series that says where its settings change. `--run` evaluates as a
run-all run does (eval_run.py); `--history` without an input shows the series (`show_series`).
Bad input fails before anything is written.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import orjson
from rich.markup import escape

from atomcli import plugins, tableio
from atomcli.errors import InputError

PERCENT = ("f1", "em", "cover_em", "best_f1", "judge_accuracy", "format_error_rate")
# (report key, Markdown title, terminal title); rates are shown as percentages like the papers' tables.
COLUMNS = [("n", "n", "n"), ("f1", "F1", "F1"), ("em", "EM", "EM"), ("cover_em", "cover-EM", "cover"),
           ("best_f1", "best F1", "best"), ("judge_accuracy", "judge", "judge"),
           ("format_error_rate", "format err", "fmt"), ("mean_turns", "turns", "turns"),
           ("searches_per_question", "searches", "srch"), ("browses_per_question", "browses", "brws"),
           ("tokens_per_question", "tokens", "tok")]


def run_to_files(mod, input_path: str | None, cfg, ctx, *, out: str | None, markdown: str | None = None,
                 history: str | None = None, compare: str | None = None, answers: str | None = None,
                 run: str | None = None, split: str | None = None, plot: str | None = None, vs: str = "first",
                 wait: float | None = None) -> dict:
    """Read INPUT (or the run's questions), evaluate, write the reports (and with `answers`, the rolled-out
    table); returns the report. Without INPUT and --run: show the --history series (`show_series`)."""
    from atomcli.stages import eval_history, eval_run
    wait = eval_history.DEFAULT_WAIT if wait is None else wait
    if split and not run:
        raise InputError("--split picks one of a run's question sets: it needs --run RUN", hint="add --run RUN")
    split = split or eval_run.TEST
    if input_path is None and run:
        input_path = eval_run.questions(run, split)
    if input_path is None:
        if not history:
            raise InputError("nothing to evaluate: give INPUT, --run RUN, or --history FILE to show its series",
                             hint="atom eval QUESTIONS --model M --out report.json, or atom eval --run RUN --out report.json")
        if compare or answers:
            raise InputError("--compare and --answers need an evaluation (INPUT or --run)",
                             hint="drop them to show the --history series")
        return show_series(history, ctx, plot=plot, vs=vs, out=out, markdown=markdown)
    if not out:
        raise InputError("--out is required when evaluating", hint="--out report.json (`-` = stdout)")
    if plot and not history:
        raise InputError("--plot draws the --history series", hint="add --history FILE")
    if vs not in eval_history.VS:
        from atomcli.errors import unknown_choice
        raise unknown_choice("--vs", vs, eval_history.VS)
    if [out, markdown, answers].count("-") > 1:
        raise InputError("only one of --out, --markdown, --answers can be `-` (stdout)",
                         hint="give the others file names")
    from atomcli import safety
    # the reports never land on the input, the baseline, the model folder or each other
    safety.check_outputs({"--out": out, "--markdown": markdown, "--history": history, "--answers": answers,
                          "--plot": plot}, inputs=[input_path, compare, getattr(cfg, "model", None)])
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
    if history:
        eval_history.last(history)  # a damaged history fails before any rollout
    if baseline is not None and "id" in table.column_names:  # a baseline of other questions fails before it too
        from atomcli.rewards import metrics
        from atomcli.stages import compare as cmp
        try:
            variant = metrics.f1_scorer(cfg.f1) if cfg.f1 in metrics.F1_VARIANTS else None
            cmp.check_baseline(mod.identities(table), baseline, compare, variant)
        except InputError as e:
            raise e.located(file=compare) from None

    def evaluate():
        try:
            rows, rolled_out = mod.answered(table, cfg, ctx)
            return rows, mod.finish_report(rows, cfg, ctx, rolled_out=rolled_out)
        except InputError as e:
            raise e.located(file=name) from None

    # an answered table is scored before the lock (its errors leave no file behind); a rollout runs under it
    done = evaluate() if "answer" in table.column_names or not cfg.model else None
    # one eval at a time per history: an overlapping cron eval waits here (bounded), then refuses
    with eval_history.locked(history, wait, ctx.log) if history else contextlib.nullcontext():
        previous = eval_history.last(history) if history else None
        rows, report = done or evaluate()
        report = {"input": name, **report}
        if run:
            report["run"] = eval_run.info(run, cfg.model, split)
        if baseline is not None:
            from atomcli.stages import compare as cmp
            try:
                report["compare"] = cmp.compare_reports(report, baseline, baseline_name=compare, seed=cfg.seed)
            except InputError as e:
                raise e.located(file=compare) from None
        line = None
        if history:
            line = eval_history.record(report)
            report["history"] = eval_history.note(previous, line, history)

        if answers:  # the transcripts behind the report, as `atom rollout` would have written them
            tableio.write_stage(rows, answers, "rollout", mod.rollout_config(cfg))
        _emit(out, to_json(report))
        if markdown:
            _emit(markdown, to_markdown(report).encode())
        if line is not None:
            eval_history.append(history, line)
    if not ctx.quiet:
        ctx.console.print(rich_table(report))
        if "compare" in report:
            ctx.console.print(compare_table(report["compare"]))
    for warning in history_warnings(report):
        ctx.log(f"[yellow]note:[/] {escape(warning)}")
    for path in (answers, out, markdown, history):
        if path and path != "-":
            ctx.log(f"[green]wrote[/] {escape(path)}")
    if plot:
        show_series(history, ctx, plot=plot, vs=vs)
    return report


def show_series(history: str, ctx, *, plot: str | None = None, vs: str = "first", out: str | None = None,
                markdown: str | None = None) -> dict:
    """The --history series as a table on stderr, and with `plot` a PNG (`out`: its JSON; `markdown`: its table)."""
    from atomcli.stages import eval_history
    if vs not in eval_history.VS:
        from atomcli.errors import unknown_choice
        raise unknown_choice("--vs", vs, eval_history.VS)
    if [out, markdown].count("-") > 1:
        raise InputError("only one of --out, --markdown can be `-` (stdout)", hint="give the other a file name")
    from atomcli import safety
    safety.check_outputs({"--out": out, "--markdown": markdown, "--plot": plot}, inputs=[history])
    lines = eval_history.read(history)
    if not lines:
        raise InputError("the history is empty", file=history, hint="`atom eval ... --history FILE` appends to it")
    points = eval_history.series(lines, vs)
    result = {"history": history, "vs": vs, "points": points}
    if out:
        _emit(out, to_json(result))
    if markdown:
        _emit(markdown, eval_history.markdown(points, history, vs).encode())
    if plot:
        eval_history.plot(points, plot, history, vs)
    if not ctx.quiet:
        ctx.console.print(eval_history.table(points, history, vs))
    for path in (out, markdown, plot):
        if path and path != "-":
            ctx.log(f"[green]wrote[/] {escape(path)}")
    return result


def history_warnings(report: dict) -> list[str]:
    """What a person must know before reading this line as the next point of the curve."""
    h = report.get("history") or {}
    out = []
    if h.get("settings_changed"):
        from atomcli import safety
        out.append(f"this eval's settings differ from the previous line of {h['file']} "
                   f"({safety.describe_diff(h['settings_changed'])}): a new measurement, not the next point of the same curve")
    if h.get("version_changed"):
        out.append(f"atomcli version changed since the previous line of {h['file']} ({h['version_changed']})")
    return out


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


def _emit(path: str, data: bytes) -> None:
    """Write atomically, or to stdout for `-`."""
    if path == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        tableio.write_bytes_atomic(Path(path), data)


# --- people-facing renderings -----------------------------------------------------------------
# Every text that comes from the data (source names, the input, the model, the baseline's name) is
# shown through safety.visible: a hostile data_source cannot drive the terminal or a Markdown viewer.

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


def shown(value) -> str:
    """Data text as it may reach a terminal: every control character written as an escape."""
    from atomcli.safety import visible
    return visible(str(value))


def _md(value) -> str:
    """Data text inside a Markdown table cell or inline code."""
    return shown(value).replace("|", "\\|").replace("`", "'")


def _text(value):
    """A rich cell holding data text: literal (no markup) and visible."""
    from rich.text import Text
    return Text(shown(value))


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
    table = Table(title=_text(title),
                  caption="F1, EM, cover(-EM), best (F1 of a group), judge, fmt (format errors) in %; "
                          "turns, srch (searches), brws (browses), tok (tokens) per question\n"
                          f"scorers: {scorer_line(report)}",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    rows = _rows(report)
    # source names matter more than wide headers when the terminal (or a CI log) is narrow
    table.add_column("source", min_width=min(24, max(len(shown(src)) for src, _ in rows)))
    for _, _, short in cols:
        table.add_column(short, justify="right")
    for i, (src, m) in enumerate(rows):
        table.add_row(_text(src), *(fmt(k, m.get(k)) for k, _, _ in cols),
                      style="bold" if i == len(rows) - 1 else None, end_section=i == len(rows) - 2)
    return table


def _paired_on(c: dict) -> str:
    keys = c.get("paired_on") or ["id"]
    text = ", ".join(keys)
    if c.get("mismatched"):
        text += f"; {c['mismatched']} shared id(s) left out: another question there"
    return text


def compare_table(c: dict):
    """Differences against the baseline with their paired bootstrap intervals."""
    from rich import box
    from rich.table import Table

    from atomcli.stages.compare import COMPARED, describe
    table = Table(title=_text(f"vs {c['baseline']} ({c['n_shared']} shared questions, paired on {_paired_on(c)}; "
                              f"paired bootstrap {100 * c['level']:.0f}% interval)"),
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("source")
    for m in COMPARED:
        table.add_column(f"Δ {m}", justify="right")
    rows = list(c["by_source"].items()) + [("overall", c["overall"])]
    for i, (src, vals) in enumerate(rows):
        table.add_row(_text(src), *(describe(vals.get(m)) for m in COMPARED),
                      style="bold" if i == len(rows) - 1 else None)
    return table


def compare_markdown(c: dict) -> list[str]:
    from atomcli.stages.compare import COMPARED, describe
    lines = ["", f"## Against `{_md(c['baseline'])}`", "",
             f"Paired over {c['n_shared']} shared questions (paired on {_md(_paired_on(c))}); "
             f"{100 * c['level']:.0f}% percentile bootstrap interval of the mean difference ({c['n_boot']} resamples).",
             "", "| data_source | " + " | ".join(f"Δ {m}" for m in COMPARED) + " |", "|---|" + "---:|" * len(COMPARED)]
    for src, vals in list(c["by_source"].items()) + [("**overall**", c["overall"])]:
        name = src if src == "**overall**" else _md(src)
        lines.append(f"| {name} | " + " | ".join(describe(vals.get(m)) for m in COMPARED) + " |")
    return lines


def to_markdown(report: dict) -> str:
    cols = _visible_columns(report)
    cfg = report.get("config") or {}
    lines = ["# atom eval report", "",
             f"- input: `{_md(report.get('input'))}`",
             f"- model: `{_md(report.get('model'))}`",
             f"- time: {_md(report.get('time'))}",
             f"- questions: {report.get('n')}, trajectories: {report.get('n_trajectories')}",
             f"- F1 variant: {report.get('f1_variant')}" + (f"; judge: `{_md(cfg['judge'])}`" if cfg.get("judge") else ""),
             f"- scorers: {scorer_line(report)}",
             "",
             "| data_source | " + " | ".join(t for _, t, _ in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for src, m in _rows(report):
        name = "**overall**" if src == "overall" else _md(src)
        lines.append(f"| {name} | " + " | ".join(fmt(k, m.get(k)) for k, _, _ in cols) + " |")
    lines += ["", "F1, EM, cover-EM, best F1 (max over a question's samples), judge accuracy and the format-error "
                  "rate are percentages; a question's value is the mean over its samples, a row's the mean over "
                  "its questions. Turns, searches, browses and tokens are per question."]
    judge_errors = report["overall"].get("judge_errors")
    if judge_errors:
        lines.append(f"\nThe judge gave no verdict for {judge_errors} answer(s); they are left out of judge accuracy.")
    for warning in history_warnings(report):
        lines.append(f"\n**Note:** {_md(warning)}")
    if "compare" in report:
        lines += compare_markdown(report["compare"])
    return "\n".join(lines) + "\n"
