"""The `atom` command line: parse flags, read tables, call a stage, write the result.

Nothing here computes anything. Each stage command is generated from its config dataclass
(fields become flags; default < `--config` file section < flags), reads its input table,
checks the columns the stage needs (schema.require), calls the stage's `run(table, config,
context)`, appends provenance and writes atomically. Expected errors print one line and
exit 2; runtime failures exit 1; `--debug` or ATOM_DEBUG=1 shows tracebacks.
stdout carries data only; everything for people goes to stderr.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import os
import re
import typing
from typing import Annotated, Callable, Optional

import typer
from typer.core import TyperCommand

from atomcli import __version__
from atomcli.errors import InputError

PROG = "atom"
_TYPES = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT"}


class AtomCommand(TyperCommand):
    """Help that reads like the `hf` CLI's: plain sections, `atom rollout [OPTIONS] QUESTIONS` in the usage
    line (not `{questions}`), TEXT/INTEGER/FLOAT after options that take a value, nothing after flags."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [re.sub(r"^\{(.+)\}", r"\1", p) for p in super().collect_usage_pieces(ctx)]

    def format_options(self, ctx, formatter) -> None:
        args, opts = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            names, text = record
            if param.param_type_name == "argument":
                args.append((param.metavar or param.name.upper(), text))
            else:
                opts.append((re.sub(r"<(\w+)>", lambda m: _TYPES.get(m[1], m[1].upper()), names), text))
        for title, rows in (("Arguments", args), ("Options", opts)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


app = typer.Typer(
    help="Train LLM research agents with RL: the Atom-Searcher recipe (atomic-thought rewards) on "
         "DeepResearcher (real web search and browsing), as composable stages over Parquet tables.",
    no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False, rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
)
STATE = {"debug": os.environ.get("ATOM_DEBUG", "") not in ("", "0")}


def _version(value: bool):
    if value:
        typer.echo(f"atomcli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and the libraries' own warnings and "
                                                        "progress bars (also ATOM_DEBUG=1).")] = False,
):
    if debug:
        STATE["debug"] = True
    if not STATE["debug"]:
        from atomcli import progress
        progress.quiet_libraries()  # before transformers, datasets or trl is imported
    from atomcli import heap
    try:
        heap.start(ctx.invoked_subcommand)  # before torch allocates; only for CPU training (heap.py says why)
    except InputError as e:
        _fail(2, e.one_line())


# --- error boundary ------------------------------------------------------------------------

def _fail(code: int, msg: str):
    from rich.console import Console
    from rich.markup import escape
    from atomcli.safety import redact_secrets, visible
    # a message may quote a page, a model or a server: no live control characters, no key in a url
    msg = visible(redact_secrets(msg))
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {escape(msg)}")
    raise typer.Exit(code)


def guarded(fn: Callable) -> Callable:
    """One error boundary for every command."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except InputError as e:
            if STATE["debug"]:
                raise
            _fail(2, e.one_line())
        except KeyboardInterrupt:
            _fail(130, "interrupted (completed work was kept where the command supports --resume)")
        except BrokenPipeError:
            os._exit(1)
        except Exception as e:  # runtime failure
            if STATE["debug"]:
                raise
            _fail(1, f"{type(e).__name__}: {e} (run with --debug for the traceback)")
    return wrapper


# --- stage commands generated from config dataclasses ---------------------------------------

IN = "Input table (Parquet or JSONL; `-` = stdin)."
OUT_TABLE = "Output table (Parquet unless --format jsonl or a .jsonl name; `-` = stdout)."


def _param(name: str, annotation, default=inspect.Parameter.empty):
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _flag_params(cfg_cls, skip=()) -> list[inspect.Parameter]:
    """One option per config field (advanced ones hidden from --help, still accepted), then one hidden
    option per removed key, so that an old spelling gets its deprecation line or its hint."""
    from atomcli import config as cfgmod
    hints = typing.get_type_hints(cfg_cls)
    params = []
    for f in dataclasses.fields(cfg_cls):
        if f.name in skip:
            continue
        typ = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        on, off = cfgmod.flag_names(f.name, typ)
        shown = ((on if default else off) if typ is bool else default)
        help_text = f.metadata.get("help", "") + (f"  [default: {shown}]" if shown != "" else "")
        names = [on] + list(f.metadata.get("short", []))
        if typ is bool:
            names = [f"{on}/{off}"]
        params.append(_param(f.name, Annotated[Optional[typ], typer.Option(
            *names, help=help_text, show_default=False, hidden=cfgmod.is_advanced(f))], None))
    for key, gone in cfgmod.removed_keys(cfg_cls).items():
        typ = str if gone.takes_value else bool
        params.append(_param(key, Annotated[Optional[typ], typer.Option(
            "--" + key.replace("_", "-"), hidden=True, show_default=False)], None))
    return params


def stage_command(name: str, module: str, config: str, args: list[tuple[str, str]], handler: Callable,
                  extra: list[inspect.Parameter] = (), skip: tuple = (), help: str = "",
                  sections: tuple[str, ...] = (), layer: Callable[[dict], dict] | None = None):
    """Register `atom NAME`: positional `args`, common options, then one flag per config field.

    `sections`: other sections of --config handed to the stage whole, as the dict field of the same
    name (eval rolls out with the file's [rollout] settings, exactly as run-all does).
    `layer`: settings (sections, as in a --config file) made from the command's own options, lying
    under the --config file's (eval --run: the run's recorded settings)."""
    mod = importlib.import_module(f"atomcli.stages.{module}")
    cfg_cls = getattr(mod, config)
    skip = tuple(skip) + tuple(sections)

    def impl(**kw):
        from atomcli import config as cfgmod
        data = cfgmod.load_file(kw.pop("config_file"))
        if layer is not None:
            base = layer(kw)
            data = {sec: {**base.get(sec, {}), **cfgmod.section(data, sec)} for sec in {*base, *data}}
        file_cfg = cfgmod.section(data, name)
        flags = {f.name: kw.pop(f.name) for f in dataclasses.fields(cfg_cls) if f.name not in skip}
        flags.update({k: kw.pop(k) for k in cfgmod.removed_keys(cfg_cls)})
        flags = {k: v for k, v in flags.items() if v is not None}
        cfg = cfgmod.build(cfg_cls, file_cfg, flags, source=f"[{name}] section")
        if sections:
            cfg = dataclasses.replace(cfg, **{sec: dict(cfgmod.section(data, sec)) for sec in sections})
        return handler(cfg, mod, **kw)

    params = [_param(a, Annotated[str, typer.Argument(help=h, show_default=False, metavar=a.upper())]) for a, h in args]
    params += list(extra)
    params.append(_param("config_file", Annotated[Optional[str], typer.Option(
        "--config", help=f"TOML file; its [{name}] section sets defaults that flags override.")], None))
    params += _flag_params(cfg_cls, skip)
    impl.__signature__ = inspect.Signature(params)
    impl.__name__ = name.replace("-", "_")
    impl.__doc__ = help or (mod.__doc__ or "").strip().split("\n\n")[0]
    from atomcli import config as cfgmod
    hidden = sum(cfgmod.is_advanced(f) for f in dataclasses.fields(cfg_cls) if f.name not in skip)
    epilog = (f"{hidden} more options (tuning knobs, engine and server settings) are accepted but not shown "
              f"here; docs/config.md lists every option of [{name}].") if hidden else None
    app.command(name, cls=AtomCommand, epilog=epilog)(guarded(impl))


OUT_OPT = _param("out", Annotated[str, typer.Option("--out", "-o", help=OUT_TABLE)])
FMT_OPT = _param("fmt", Annotated[Optional[str], typer.Option("--format", help="Output format: parquet or jsonl.")], None)


def _context():
    from atomcli.context import Context
    return Context()


def _table_stage(stage: str):
    """Handler for stages that map a table to a table."""
    def handler(cfg, mod, *, input: str, out: str, fmt: str | None):
        from atomcli import envelope
        envelope.table_to_table(stage, mod, cfg, input, out, _context(), fmt)
    return handler


def _rollout_handler(cfg, mod, *, questions: str, out: str, fmt: str | None, resume: bool):
    from atomcli import plugins
    plugins.check_search_spec(cfg.search)
    from atomcli import envelope
    table = envelope.read_input(questions, "rollout")
    from atomcli.stages import rollout_io
    rollout_io.run_to_file(mod, table, cfg, _context(), out=out, fmt=fmt, resume=resume, inputs=[questions])


def _checkpoint_stage(stage: str):
    """Handler for stages that write a checkpoint folder (sft, grpo-step)."""
    def handler(cfg, mod, *, data: str, out: str):
        from atomcli import envelope
        ctx = _context()
        envelope.table_to_checkpoint(stage, mod, cfg, data, out, ctx)
        ctx.log(f"[green]wrote[/] {out}")
    return handler


def _eval_handler(cfg, mod, *, input: str | None, out: str | None, markdown: str | None, history: str | None,
                  compare: str | None, answers: str | None, run: str | None, split: str | None, plot: str | None,
                  vs: str, wait: float):
    from atomcli.stages import evaluate_io
    evaluate_io.run_to_files(mod, input, cfg, _context(), out=out, markdown=markdown, history=history,
                             compare=compare, answers=answers, run=run, split=split, plot=plot, vs=vs, wait=wait)


def _eval_run_layer(kw: dict) -> dict:
    """eval --run RUN: the run's recorded eval settings, under --config and flags."""
    if not kw.get("run"):
        return {}
    from atomcli.stages import eval_run
    return eval_run.sections(kw["run"], kw.get("split") or eval_run.TEST)


stage_command("sft", "sft", "SFTConfig", [("data", "Trajectory table or chat JSONL (`messages` column).")],
              _checkpoint_stage("sft"),
              extra=[_param("out", Annotated[str, typer.Option("--out", "-o", help="Checkpoint folder to write.")])])
stage_command("rollout", "rollout", "RolloutConfig", [("questions", "FlashRAG questions: id, question, golden_answers.")],
              _rollout_handler,
              extra=[OUT_OPT, FMT_OPT, _param("resume", Annotated[bool, typer.Option(
                  "--resume", help="Skip groups already in --out (after a crash or Ctrl-C).")], False)])
stage_command("score-rrm", "score_rrm", "ScoreConfig", [("input", "Rollout table.")],
              _table_stage("score-rrm"), extra=[OUT_OPT, FMT_OPT])
stage_command("score-ig", "score_ig", "IGConfig", [("input", "Rollout table (token columns and golden answers).")],
              _table_stage("score-ig"), extra=[OUT_OPT, FMT_OPT])
stage_command("aggregate-reward", "aggregate_reward", "AggregateConfig", [("input", "Scored rollout table.")],
              _table_stage("aggregate-reward"), extra=[OUT_OPT, FMT_OPT])
stage_command("rft", "rft", "RFTConfig", [("input", "Rollout table on training questions (several samples each).")],
              _table_stage("rft"), extra=[OUT_OPT, FMT_OPT])
stage_command("grpo-step", "grpo_step", "GRPOConfig", [("data", "Rewarded rollout table.")],
              _checkpoint_stage("grpo-step"),
              extra=[_param("out", Annotated[str, typer.Option("--out", "-o", help="New checkpoint folder.")])])
from atomcli.stages.evaluate import HISTORY_WAIT as _EVAL_WAIT  # noqa: E402

stage_command("eval", "evaluate", "EvalConfig", [], _eval_handler, sections=("rollout",), layer=_eval_run_layer,
              extra=[_param("input", Annotated[Optional[str], typer.Argument(
                         help="Answered rollouts, or questions with --model (default with --run: the run's test "
                              "questions; none with --history alone: show its series).",
                         show_default=False, metavar="INPUT")], None),
                     _param("run", Annotated[Optional[str], typer.Option("--run", help="Evaluate as this run of `atom run-all` evaluates: its questions, search, [rollout] and [eval] settings from RUN/config.json, and its newest checkpoint; --config and flags override.")], None),
                     _param("split", Annotated[Optional[str], typer.Option("--split", help="With --run: the run's question set, test (default), transfer (its second test set, with its transfer_search) or dev (its held-out training questions).")], None),
                     _param("out", Annotated[Optional[str], typer.Option("--out", "-o", help="Report JSON (`-` = stdout); with --history alone, the series JSON.")], None),
                     _param("markdown", Annotated[Optional[str], typer.Option("--markdown", help="Also write a Markdown report.")], None),
                     _param("history", Annotated[Optional[str], typer.Option("--history", help="Append one JSON line per run (for cron): checkpoint, version, settings digest, per-question scores; a settings change is reported. Alone (no INPUT, no --run): show its series.")], None),
                     _param("plot", Annotated[Optional[str], typer.Option("--plot", help="Draw the --history series as a PNG: F1 per line, ΔF1 with paired 95% intervals, settings changes marked.")], None),
                     _param("vs", Annotated[str, typer.Option("--vs", help="The series' ΔF1 is paired with the `first` line of the same settings, or the `previous` line.")], "first"),
                     _param("wait", Annotated[float, typer.Option("--wait", help="Seconds to wait for another eval writing the same --history before refusing.")], _EVAL_WAIT),
                     _param("compare", Annotated[Optional[str], typer.Option("--compare", help="Baseline: a report JSON or an answered table of the same questions; adds F1/EM differences with paired 95% bootstrap intervals (only questions with the same id, text, golden answers and data_source are paired).")], None),
                     _param("answers", Annotated[Optional[str], typer.Option("--answers", help="With --model: also write the answered table it rolls out (Parquet, or JSONL by extension), the transcripts behind the report.")], None)],
              help="F1 / EM / cover-EM per data_source of answered rollouts, or of a model rolled out on questions; "
                   "with --run, exactly as a run-all run evaluates.")


# --- utility commands ------------------------------------------------------------------------

from atomcli.stages.run_all import presets as _run_all_presets  # noqa: E402  (the --preset help is data)


@app.command("run-all", cls=AtomCommand)
@guarded
def run_all_cmd(
    out: Annotated[str, typer.Option("--out", "-o", help="Run folder: every table, checkpoint, metrics.jsonl, summary.md, plots.")],
    preset: Annotated[Optional[str], typer.Option("--preset", help=_run_all_presets.preset_help())] = None,
    config_file: Annotated[Optional[str], typer.Option("--config", help="TOML file: [run-all] plus one section per stage (on top of --preset).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the last complete step in --out.")] = False,
    demo: Annotated[bool, typer.Option("--demo", hidden=True, help="Deprecated: --preset demo.")] = False,
    quick: Annotated[bool, typer.Option("--quick", hidden=True, help="Deprecated: --preset quick.")] = False,
):
    """SFT, optional rejection-sampling rounds (sample, keep the right answers, tune), then
    N x [rollout -> score-rrm -> aggregate-reward -> grpo-step], with evals and a summary; one process."""
    from atomcli.stages import run_all
    run_all.main(out=out, config_file=config_file, preset=preset, demo=demo, quick=quick, resume=resume,
                 context=_context())


@app.command("index", cls=AtomCommand)
@guarded
def index_cmd(
    corpus: Annotated[str, typer.Argument(help="Corpus JSONL/Parquet with id, title, contents (or text), optional url.", metavar="CORPUS")],
    out: Annotated[str, typer.Option("--out", "-o", help="Index file to write (SQLite).")],
    engine: Annotated[str, typer.Option("--engine", help="fts5 (SQLite, default) or tantivy if installed.")] = "fts5",
    impacts: Annotated[bool, typer.Option("--impacts/--no-impacts",
                                          help="Precompute BM25 impacts: faster queries for a slower build and a "
                                               "larger index (bench/RESULTS.md); same ranking.")] = True,
):
    """Build the local full-text (BM25) search index."""
    from atomcli.env import search_local
    search_local.build_index(corpus, out, engine=engine, impacts=impacts, context=_context())


@app.command("search", cls=AtomCommand)
@guarded
def search_cmd(
    query: Annotated[str, typer.Argument(help="Search query.", metavar="QUERY")],
    index: Annotated[Optional[str], typer.Option("--index", help="Local index (same as --search local:INDEX).")] = None,
    search: Annotated[Optional[str], typer.Option("--search", help="Search SPEC: local:INDEX, ddg, replay:CACHE.")] = None,
    k: Annotated[int, typer.Option("-k", "--k", help="Results to show.")] = 10,
    cache: Annotated[Optional[str], typer.Option("--cache", help="SQLite cache file.")] = None,
    replay: Annotated[bool, typer.Option("--replay", help="Serve only from --cache.")] = False,
    fmt: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
):
    """Show what the agent's web_search would see, through the rollout's own code path."""
    from atomcli.stages import tools_cli
    tools_cli.search(query, index=index, search=search, k=k, cache=cache, replay=replay, fmt=fmt, context=_context())


@app.command("browse", cls=AtomCommand)
@guarded
def browse_cmd(
    url: Annotated[str, typer.Argument(help="URL to read (or a local result url).", metavar="URL")],
    query: Annotated[str, typer.Option("--query", "-q", help="What the reader looks for.")] = "",
    search: Annotated[Optional[str], typer.Option("--search", help="Search SPEC whose local urls to resolve (local:INDEX).")] = None,
    cache: Annotated[Optional[str], typer.Option("--cache", help="SQLite cache file.")] = None,
    replay: Annotated[bool, typer.Option("--replay", help="Serve only from --cache.")] = False,
    allow_hosts: Annotated[str, typer.Option("--allow-hosts", help="Comma-separated hosts the SSRF guard lets through.")] = "",
    reader: Annotated[str, typer.Option("--reader", help="bm25, or a judge SPEC (hf:MODEL, openai:...).")] = "bm25",
    fmt: Annotated[str, typer.Option("--format", help="text or json.")] = "text",
):
    """Show what browse_webpage would return for a URL (fetch, guard, extract, read)."""
    from atomcli.stages import tools_cli
    tools_cli.browse(url, query=query, search=search, cache=cache, replay=replay, allow_hosts=allow_hosts,
                     reader=reader, fmt=fmt, context=_context())


@app.command("demo-world", cls=AtomCommand)
@guarded
def demo_world_cmd(
    out: Annotated[str, typer.Option("--out", "-o", help="Folder for corpus.jsonl, train/test.jsonl, sft.parquet, index.")],
    seed: Annotated[int, typer.Option("--seed", help="Same seed, same bytes.")] = 0,
    articles: Annotated[int, typer.Option("--articles", help="Approximate number of encyclopedia articles.")] = 2400,
    train: Annotated[int, typer.Option("--train", help="Training questions.")] = 400,
    test: Annotated[int, typer.Option("--test", help="Test questions.")] = 100,
    sft: Annotated[int, typer.Option("--sft", help="Scripted-expert SFT trajectories.")] = 200,
    real: Annotated[Optional[str], typer.Option("--real", help="Instead, write the shipped real-text benchmark "
                                                "NAME (sqlite: SQLite's documentation); the other flags are ignored.")] = None,
    style: Annotated[str, typer.Option("--style", help="classic (the default world and expert), "
                                       "stepwise (the classic world; "
                                       "an expert that names no hop count and restates the question after each "
                                       "fact) or stepwise-real (stepwise plus the SQLite benchmark's passages, "
                                       "train questions and expert trajectories).")] = "classic",
    snippets: Annotated[str, typer.Option("--snippets", help="Snippet order the experts' searches see: text "
                                          "(as cut from the page) or query (sentences with the most query words "
                                          "first; stepwise styles only). Roll out and evaluate on the world "
                                          "with the same --search-options snippets=...")] = "text",  # PAGE_ORDER
):
    """Write the embedded fictional research world (corpus, questions, SFT set, index)."""
    if real is not None:
        from pathlib import Path

        from atomcli.demo import real_docs
        real_docs.build(real, Path(out), context=_context())
        return
    from atomcli.demo import world as demo_world
    demo_world.main(out, seed=seed, articles=articles, train=train, test=test, sft=sft, style=style,
                    snippets=snippets, context=_context())


@app.command("show", cls=AtomCommand)
@guarded
def show_cmd(
    table: Annotated[str, typer.Argument(help="Trajectory table.", metavar="TABLE")],
    row: Annotated[Optional[int], typer.Option("--row", help="Show only this row.")] = None,
    html: Annotated[Optional[str], typer.Option("--html", help="Write one self-contained HTML page.")] = None,
):
    """Render trajectories for a person: turns, tool calls, scored atomic thoughts, rewards."""
    from atomcli.stages import show
    show.main(table, row=row, html=html, context=_context())


def main():
    app(prog_name=PROG)  # `python -m atomcli` too: completion and usage name `atom`


if __name__ == "__main__":
    main()
