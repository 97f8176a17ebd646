"""Stage `score-rrm`: the Reasoning Reward Model scores every atomic thought (Atom-Searcher).

Owns `atomic_thoughts`, `atr`, `rrm_judge`, `rrm_error`. The prompt format the judge reads and
the reader of its reply live in `atomcli.rewards.rrm_prompt` (judges use them too).

For each trajectory the atomic thoughts of every assistant turn are extracted
(`agent_format.atomic_thoughts`; a `<think>` with no tagged units is one unit tagged THINK)
and numbered across the whole trajectory. The judge sees the question, each turn's numbered
thoughts, the action it took and the observation that came back — never the golden answer —
and is asked for a JSON list of integer scores 0-10, one per thought (is it correct, grounded
in what was observed so far, useful for the next step). `atr` = mean score / 10, in [0, 1].

Failure is never a score: when the judge errs (after its own transport retries) or its reply
does not parse after `retries` attempts (a JSON list possibly inside prose or code fences; a
list of the wrong length or with a score outside 0-10 counts as unparseable), the row gets
`rrm_error` set, `atr` null and every thought's `score` null; `aggregate-reward` then falls
back to the outcome reward for that row. Unparseable replies are retried with a reminder
appended to the prompt, so that a greedy judge does not just repeat itself.

A trajectory with no atomic thoughts at all (no `<think>`, or only empty ones) is not sent to
the judge: there is no reasoning to reward, so `atr` = 0.0 with `rrm_error` null. That is a
legitimate score, not a failure.

All prompts go to the judge in one `complete` call: concurrency and batching are the judge's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.markup import escape

from atomcli import plugins, schema, stats
from atomcli.config import opt
from atomcli.errors import InputError
from atomcli.rewards.rrm_prompt import (
    RETRY_REMINDER,
    parse_scores,
    render_prompt,
    trajectory_steps,
)


@dataclass
class ScoreConfig:
    judge: str = opt("heuristic", "judge SPEC: heuristic, hf:MODEL (hf:smollm2), openai:BASE_URL#MODEL")
    retries: int = opt(3, "attempts per trajectory when the judge's reply does not parse (transport faults are "
                          "retried this many times inside the openai judge)", advanced=True)
    concurrency: int = opt(8, "parallel requests to an OpenAI-compatible judge")
    timeout: float = opt(120.0, "seconds per judge request", advanced=True)
    rate: float = opt(0.0, "judge calls per second (0 = unlimited)")
    backoff: float = opt(1.0, "seconds before the first retry of a failed judge request (doubles each time)",
                         advanced=True)
    api_key_env: str = opt("OPENAI_API_KEY", "environment variable holding the judge's API key")
    batch_size: int = opt(8, "prompts per batch for hf: judges", advanced=True)
    max_new_tokens: int = opt(256, "tokens the judge may write", advanced=True)
    obs_chars: int = opt(1500, "characters of each observation shown to the judge; longer ones are cut (0 = all)",
                         advanced=True)


# --- the stage ---------------------------------------------------------------------------------

def judge_options(config: ScoreConfig) -> dict:
    """Everything a judge factory may use; each judge ignores what it does not."""
    return {"concurrency": config.concurrency, "timeout": config.timeout, "rate": config.rate,
            "retries": config.retries, "backoff": config.backoff, "api_key_env": config.api_key_env,
            "batch_size": config.batch_size, "max_new_tokens": config.max_new_tokens}


def _validate(config: ScoreConfig) -> None:
    checks = [("retries", config.retries >= 1), ("concurrency", config.concurrency >= 1),
              ("timeout", config.timeout > 0), ("rate", config.rate >= 0), ("backoff", config.backoff >= 0),
              ("batch_size", config.batch_size >= 1), ("max_new_tokens", config.max_new_tokens >= 1),
              ("obs_chars", config.obs_chars >= 0)]
    for name, ok in checks:
        if not ok:
            raise InputError(f"option --{name.replace('_', '-')} is out of range ({getattr(config, name)!r})",
                             hint="retries, concurrency, batch sizes and token counts >= 1; timeout > 0")


def score(judge, prompts: dict[int, str], counts: dict[int, int], retries: int, *, progress=None
          ) -> tuple[dict[int, list[float]], dict[int, str]]:
    """Ask the judge for every prompt at once; re-ask only the unparseable ones.

    Returns (scores by row, errors by row); every row of `prompts` is in exactly one. `progress`
    (atomcli.progress.Progress) advances by one per first reply and notes the retries."""
    scores: dict[int, list[float]] = {}
    errors: dict[int, str] = {}
    pending = list(prompts)
    for attempt in range(1, retries + 1):
        if not pending:
            break
        asked = [prompts[i] + (RETRY_REMINDER.format(n=counts[i]) if attempt > 1 else "") for i in pending]
        report = None
        if progress is not None:
            if attempt == 1:
                report = progress.advance
            else:
                progress.update(info=f"re-asking {len(asked)} unparseable (attempt {attempt}/{retries})")
        try:
            replies = list(plugins.judge_complete(judge, asked, report))
            if len(replies) != len(asked):
                raise RuntimeError(f"judge returned {len(replies)} replies for {len(asked)} prompts")
        except Exception as e:  # a misbehaving (third-party) judge loses these rows, never the run
            replies = [e] * len(asked)
        retry_rows = []
        for i, reply in zip(pending, replies):
            if not isinstance(reply, str):
                # the judge already retried its transient faults: do not multiply them here
                errors[i] = f"judge error: {type(reply).__name__}: {reply}"[:500]
                continue
            parsed = parse_scores(reply, counts[i])
            if parsed is not None:
                scores[i] = parsed
                errors.pop(i, None)
            else:
                errors[i] = (f"unparseable judge reply after {attempt} attempt(s), expected a JSON list of "
                             f"{counts[i]} scores 0-10: {reply[:200]!r}")
                retry_rows.append(i)
        pending = retry_rows
    return scores, errors


CHUNK = 1024  # trajectories in flight at once: bounds memory on 100k-row tables, keeps a judge server busy


def run(table, config: ScoreConfig, context):
    _validate(config)
    t0 = time.time()
    judge = context.judge(config.judge, **judge_options(config))  # fails before any work
    context.log(f"score-rrm: {table.num_rows} trajectories -> judge {escape(judge.name)}")
    thoughts_col, atr_col, err_col, counts = [], [], [], {}
    from atomcli.progress import Progress
    # Chunk by chunk: the messages of 100k trajectories as Python objects, with their rendered
    # prompts, would take ~3 GB on top of the table.
    with Progress(context, "score-rrm", table.num_rows, "trajectories") as progress:
        for start in range(0, table.num_rows, CHUNK):
            part = table.slice(start, CHUNK)
            questions = part.column("question").to_pylist()
            all_steps = [trajectory_steps(m) for m in part.column("messages").to_pylist()]
            n = {i: sum(len(s.thoughts) for s in steps) for i, steps in enumerate(all_steps)}
            prompts = {i: render_prompt(questions[i], steps, config.obs_chars)
                       for i, steps in enumerate(all_steps) if n[i]}
            progress.advance(len(all_steps) - len(prompts))  # no thoughts: nothing to ask
            scores, errors = score(judge, prompts, n, config.retries, progress=progress)
            for i, steps in enumerate(all_steps):
                counts[start + i] = n[i]
                thoughts, atr, err = _row_columns(steps, scores.get(i), errors.get(i))
                thoughts_col.append(thoughts)
                atr_col.append(atr)
                err_col.append(err)
            progress.update(completed=start + part.num_rows,
                            info=f"judge errors {sum(e is not None for e in err_col)}")
    _summary(context, judge.name, atr_col, err_col, counts, time.time() - t0)
    return schema.set_columns(table, {"atomic_thoughts": thoughts_col, "atr": atr_col,
                                      "rrm_judge": [judge.name] * table.num_rows, "rrm_error": err_col})


def _row_columns(steps, row_scores: list[float] | None, error: str | None):
    """(atomic_thoughts, atr, rrm_error) of one trajectory."""
    units = [(turn, tag, text) for turn, step in enumerate(steps) for tag, text in step.thoughts]
    thoughts = [{"turn": turn, "tag": tag, "text": text, "score": row_scores[j] if row_scores else None}
                for j, (turn, tag, text) in enumerate(units)]
    if not units:
        return thoughts, 0.0, None  # nothing to reward: a legitimate 0, not a failure
    if row_scores is not None:
        return thoughts, sum(row_scores) / len(row_scores) / 10, None
    return thoughts, None, error or "judge gave no reply"


def _summary(context, name: str, atr: list, errors: list, counts: dict, seconds: float) -> None:
    scored = [a for a, e in zip(atr, errors) if a is not None]
    n_err = sum(e is not None for e in errors)
    empty = sum(1 for c in counts.values() if c == 0)
    mean = stats.mean(scored)
    mean = float("nan") if mean is None else mean
    color = "yellow" if n_err else "green"
    context.log(f"[{color}]score-rrm[/] judge {escape(name)}: {len(atr)} trajectories, "
                f"{sum(counts.values())} atomic thoughts, mean ATR {mean:.3f}, "
                f"judge errors {n_err}, no thoughts {empty}, {seconds:.1f} s")
    context.log_first_error("judge", errors)
