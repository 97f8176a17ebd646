"""The eval time series: `atom eval --history FILE` lines, the lock around them, and the series view.

Each line of a history is one evaluation (`record`): when, which checkpoint, the atomcli version,
the overall numbers, each question's scores (so that any two lines can be paired question by
question, `compare.compare_reports`), and `settings`: everything that can move the number (the
F1 scorer, the judge, the evaluated questions as a digest, and for a rolled-out eval every
rollout setting but the model), with `settings_digest` its fingerprint. A line whose settings
differ from the line before it says so (`settings_changed`), and so do the report and the
terminal: two different measurements are never joined silently in one curve.

`locked`: an eval that appends to a history holds `FILE.lock` (fcntl.flock) from before its
rollout until its last write, so two cron evals that overlap run one after the other (the second
waits up to `--wait` seconds, then refuses with one line) and each line's predecessor is the eval
that really ran before it.

`series` reads a history back: one point per line with its paired 95% interval of ΔF1 against
the first line of its settings segment (`vs="first"`) or against the line before it
(`vs="previous"`); a point whose settings differ from its reference gets no interval. `table`,
`markdown` and `plot` draw it; every text from the file is shown through `safety.visible`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import json
import os
import time
from pathlib import Path

import orjson

from atomcli.errors import InputError
from atomcli.stages import compare
from atomcli.stages.evaluate import HISTORY_WAIT as DEFAULT_WAIT  # noqa: F401  (evaluate_io's default)

FORMAT = 2  # history lines with settings and per-question scores (lines without `format` came earlier)
LOCK_SUFFIX = ".lock"
# rollout settings that cannot move a score: the checkpoint is recorded on its own, the rest only pace requests
NOT_SETTINGS = ("model", "concurrency", "policy_sync", "policy_version")
VS = ("first", "previous")
SERIES_BOOT = 2000  # resamples per point: a year of nightly points stays quick to draw
NOT_RECORDED = "settings not recorded (a line written by an older atomcli)"


# --- one line -------------------------------------------------------------------------------------

def settings_of(report: dict) -> dict:
    """Every setting of a report that can move its numbers."""
    cfg = report.get("config") or {}
    out = {"kind": report.get("kind"), "f1_variant": report.get("f1_variant"),
           "judge": cfg.get("judge") or None, "questions": questions_digest(report.get("per_question") or {}),
           "n": report.get("n")}
    if cfg.get("judge"):
        out["judge_batch"] = cfg.get("judge_batch")
    if report.get("rollout"):
        rollout = {k: v for k, v in report["rollout"].items() if k not in NOT_SETTINGS}
        if isinstance(rollout.get("search"), str):
            rollout["search"] = _canonical_search(rollout["search"])
        out["rollout"] = rollout
    return out


def _canonical_search(spec: str) -> str:
    """`local:runs/x/index.sqlite` and `local:/abs/runs/x/index.sqlite` are one index: compare real paths."""
    name, sep, rest = spec.partition(":")
    if name == "local" and sep and rest and os.path.exists(rest):
        return f"local:{os.path.realpath(rest)}"
    return spec


def questions_digest(per_question: dict) -> str:
    """A fingerprint of the evaluated question set: ids, texts, golden answers and sources."""
    keys = sorted([str(qid), q.get(compare.QUESTION), q.get(compare.GOLDS), q.get(compare.SOURCE)]
                  for qid, q in per_question.items())
    return digest(keys)


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def record(report: dict) -> dict:
    """The line appended for a report."""
    from atomcli import __version__
    settings = settings_of(report)
    keep = (compare.SOURCE, compare.QUESTION, compare.GOLDS, *compare.COMPARED)
    return {"format": FORMAT, "time": report.get("time"), "input": report.get("input"),
            "model": report.get("model"), "checkpoint": report.get("model"), "version": __version__,
            "run": (report.get("run") or {}).get("folder"), "eval_point": (report.get("run") or {}).get("eval_point"),
            "f1_variant": report.get("f1_variant"), "judge": settings["judge"], "n": report.get("n"),
            "overall": report.get("overall"),
            "f1_by_source": {src: m.get("f1") for src, m in (report.get("by_source") or {}).items()},
            "settings_digest": digest(settings), "settings": settings,
            "per_question": {qid: {k: q.get(k) for k in keep} for qid, q in (report.get("per_question") or {}).items()}}


def changes(previous: dict | None, line: dict) -> list[str]:
    """How `line`'s settings differ from `previous`'s (`[]`: the same measurement, or no previous line)."""
    if previous is None:
        return []
    if "settings" not in previous or "settings" not in line:
        return [] if "settings" not in previous and "settings" not in line else [NOT_RECORDED]
    if previous.get("settings_digest") == line.get("settings_digest"):
        return []
    from atomcli import safety
    return safety.config_diff(previous["settings"], line["settings"]) or ["settings digest differs"]


def note(previous: dict | None, line: dict, path: str) -> dict | None:
    """The report's `history` block: what the line before this one was, and what changed since."""
    if previous is None:
        return {"file": path, "previous": None, "settings_changed": [], "version_changed": None}
    version = None
    if previous.get("version") != line.get("version"):
        version = f"{previous.get('version') or 'unknown'} -> {line.get('version')}"
    return {"file": path, "previous": {"time": previous.get("time"), "checkpoint": previous.get("checkpoint")
                                       or previous.get("model"), "settings_digest": previous.get("settings_digest")},
            "settings_changed": changes(previous, line), "version_changed": version}


# --- the file -------------------------------------------------------------------------------------

def read(path: str | Path) -> list[dict]:
    """Every line of a history; a line that is not a JSON object is an error naming the file and line."""
    p = Path(path)
    if not p.is_file():
        raise InputError("history not found", file=str(path), hint="give the file `atom eval --history` appends to")
    lines = []
    for i, raw in enumerate(p.read_bytes().splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise InputError(f"line {i} is not JSON ({e})", file=str(path),
                             hint="a history holds one JSON object a line, as `atom eval --history` writes") from None
        if not isinstance(line, dict) or not isinstance(line.get("overall"), dict):
            raise InputError(f"line {i} is not an eval history line (no `overall` object)", file=str(path),
                             hint="a history holds one JSON object a line, as `atom eval --history` writes")
        lines.append(line)
    return lines


def last(path: str | Path) -> dict | None:
    """The history's last line (None: no history yet)."""
    if not Path(path).exists():
        return None
    lines = read(path)
    return lines[-1] if lines else None


def append(path: str | Path, line: dict) -> None:
    """Append one line with a single write(2) on an O_APPEND descriptor (whole lines, never fragments)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@contextlib.contextmanager
def locked(history: str | Path, wait: float, log=None):
    """Hold `HISTORY.lock` (an exclusive flock) for the body; wait up to `wait` seconds for another
    holder, then refuse with one line naming it. The lock goes with the process (kill -9 included)."""
    history = Path(history)
    path = history.with_name(history.name + LOCK_SUFFIX)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + max(0.0, wait)
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
                left = deadline - time.monotonic()
                if left <= 0:
                    raise InputError(f"another `atom eval` ({holder}) is still writing this history", file=str(history),
                                     hint="let it finish, or pass --wait SECONDS to wait for it") from None
                if log is not None and not told:
                    log(f"[yellow]waiting[/] up to {left:.0f} s for another `atom eval` ({holder}) on {history}")
                    told = True
                time.sleep(min(1.0, left))
        since = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, since {since}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


# --- the series -----------------------------------------------------------------------------------

def series(lines: list[dict], vs: str = "first", *, n_boot: int = SERIES_BOOT) -> list[dict]:
    """One point per line: its numbers, its settings change, and ΔF1 with a paired 95% interval
    against its reference line (1-based `vs_line`; None when it has no comparable reference)."""
    if vs not in VS:
        from atomcli.errors import unknown_choice
        raise unknown_choice("--vs", vs, VS)
    points, start = [], 0
    for i, line in enumerate(lines):
        changed = changes(lines[i - 1], line) if i else []
        if changed:
            start = i  # a new settings segment: nothing before it is the same measurement
        ref = start if vs == "first" else (i - 1 if i and not changed else None)
        overall = line.get("overall") or {}
        point = {"line": i + 1, "time": line.get("time"), "checkpoint": line.get("checkpoint") or line.get("model"),
                 "eval_point": line.get("eval_point"),
                 "version": line.get("version"), "n": line.get("n"), "f1": overall.get("f1"), "em": overall.get("em"),
                 "settings_digest": line.get("settings_digest"), "settings_changed": changed,
                 "vs_line": None, "delta_f1": None, "paired": None, "note": None}
        if "settings" not in line and i:
            point["note"] = NOT_RECORDED
        if ref is not None and ref != i and "per_question" in line and "per_question" in lines[ref]:
            try:
                c = compare.compare_reports(line, lines[ref], baseline_name=f"line {ref + 1}", n_boot=n_boot,
                                            metrics=("f1",))
                point.update(vs_line=ref + 1, delta_f1=c["overall"]["f1"], paired=c["n_shared"])
            except InputError as e:  # no question in common: the point stands alone
                point["note"] = e.what
        points.append(point)
    return points


def _describe_point(p: dict) -> str:
    if p["delta_f1"] is None:
        return "–"
    return f"{compare.describe(p['delta_f1'])} vs {p['vs_line']}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def _settings_text(p: dict) -> str:
    if p["settings_changed"]:  # the names only: the values are in the series JSON and the report
        names = list(dict.fromkeys(d.split(": ", 1)[0] for d in p["settings_changed"]))
        return "CHANGED: " + ", ".join(names[:4]) + (f" +{len(names) - 4}" if len(names) > 4 else "")
    return (p["settings_digest"] or "")[:8] or (p["note"] or "-")


def _short_checkpoint(p: dict) -> str:
    """A run's eval point (`step-0002`), else the checkpoint's last three path parts."""
    if p.get("eval_point"):
        return p["eval_point"]
    ckpt = str(p["checkpoint"] or "-")
    parts = Path(ckpt).parts
    return ckpt if len(parts) <= 3 else str(Path(*parts[-3:]))


def rows(points: list[dict]) -> list[list[str]]:
    """The series as text cells (line, time, checkpoint, version, n, F1, EM, ΔF1 [95%], settings), made visible."""
    from atomcli import safety
    return [[safety.visible(str(x)) for x in (p["line"], (p["time"] or "-")[:16].replace("T", " "),
                                              _short_checkpoint(p), p["version"] or "-",
                                              "-" if p["n"] is None else p["n"], _pct(p["f1"]), _pct(p["em"]),
                                              _describe_point(p), _settings_text(p))]
            for p in points]


HEADERS = ("#", "time", "checkpoint", "version", "n", "F1", "EM", "ΔF1 [95%]", "settings")


def table(points: list[dict], title: str, vs: str):
    """The rich table of the series (for stderr)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from atomcli import safety
    t = Table(title=Text(safety.visible(f"eval history {title}: ΔF1 paired with the {vs} comparable line")),
              caption="F1 and EM in %; ΔF1 is a difference of fractions with its paired bootstrap 95% interval; "
                      "CHANGED marks a line measured with other settings than the line before it",
              box=box.SIMPLE_HEAD, pad_edge=False)
    for h in HEADERS:
        t.add_column(h, justify="right" if h in ("#", "n", "F1", "EM") else "left",
                     no_wrap=h not in ("checkpoint", "settings"), overflow="fold")
    for cells, p in zip(rows(points), points):
        t.add_row(*(Text(c) for c in cells), style="yellow" if p["settings_changed"] else None)
    return t


def markdown(points: list[dict], title: str, vs: str) -> str:
    lines = [f"# atom eval history `{_md(title)}`", "",
             f"ΔF1 is paired question by question with the {vs} line of the same settings (95% percentile "
             "bootstrap interval); **CHANGED** marks a line measured with other settings than the line before it, "
             "where the curve starts again.", "",
             "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for cells, p in zip(rows(points), points):
        cells = [_md(c) for c in cells]
        if p["settings_changed"]:
            cells[-1] = f"**{cells[-1]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    from atomcli import safety
    return safety.visible(str(text)).replace("|", "\\|").replace("`", "'")


def plot(points: list[dict], out: str | Path, title: str, vs: str) -> None:
    """F1 per line (top) and ΔF1 with its paired interval (bottom); settings changes as dashed lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from atomcli import safety, tableio
    xs = [p["line"] for p in points]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6.0, 0.35 * len(points) + 3), 6), sharex=True)
    segments, current = [], []  # a settings change starts a new curve: two measurements are never joined
    for p in points:
        if p["settings_changed"] and current:
            segments.append(current)
            current = []
        current.append(p)
    segments.append(current)
    for key, label, color in (("f1", "F1", "tab:blue"), ("em", "EM", "tab:orange")):
        for k, seg in enumerate(segments):
            pts = [(p["line"], p[key]) for p in seg if p[key] is not None]
            if pts:
                top.plot(*zip(*pts), marker="o", color=color, label=label if k == 0 else None)
    top.set_ylabel("score")
    top.legend(loc="best")
    top.set_title(safety.visible(f"eval history {Path(title).name}"))
    paired = [p for p in points if p["delta_f1"] is not None]
    if paired:
        d = [p["delta_f1"] for p in paired]
        bottom.errorbar([p["line"] for p in paired], [c["diff"] for c in d],
                        yerr=[[c["diff"] - c["low"] for c in d], [c["high"] - c["diff"] for c in d]],
                        fmt="o", capsize=3)
    bottom.axhline(0.0, color="grey", linewidth=0.8)
    bottom.set_ylabel(f"ΔF1 vs {vs} (95%)")
    bottom.set_xlabel("history line")
    for p in points:
        if p["settings_changed"]:
            for ax in (top, bottom):
                ax.axvline(p["line"] - 0.5, color="red", linestyle="--", linewidth=1)
            top.annotate("settings changed", (p["line"] - 0.5, 1.0), xycoords=("data", "axes fraction"),
                         rotation=90, va="top", ha="right", fontsize=7, color="red")
    bottom.set_xticks(xs)
    fig.tight_layout()
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    tableio.write_bytes_atomic(Path(out), buf.getvalue())
