"""Stage `eval`: F1 / EM / cover-EM per data_source, decoupled from training.

Takes answered rollouts, or questions plus a model (then it runs the rollout itself,
greedy by default, one sample per question). Rows are matched to questions by `id`, never
by position: golden answers and `data_source` come from the rows themselves (a rollout
carries the question columns through), and rows sharing an `id` must agree on them.

How the numbers are aggregated (so that shuffled rows and any group size give one answer):
- every trajectory gets F1 (`--f1 squad|hotpot|set`, token = squad), EM (SQuAD) and cover-EM
  (FlashRAG sub-EM) against its golden answers, exactly as the official scorers; the report's
  `scorers` says which scorer each number comes from;
- a question's value is the mean over its samples (a group of G trajectories with one id);
  `best_f1` is the group's maximum F1 (a pass@k-style "best of group" number; it equals
  `f1` when there is one sample per question);
- a source's value (and `overall`) is the mean over its questions, so every question
  weighs the same whatever its group size. Sums use math.fsum, so row order cannot change
  a single bit of the report.
Rates are fractions in [0, 1] in the report (people-facing tables show percentages).
A metric whose column is absent (e.g. `format_ok` in a hand-made table) is null.

The optional LLM judge (`--judge SPEC`) gives a correct/incorrect verdict per answered
trajectory (MBE-style prompt: question, golden answers, prediction). A trajectory with no
answer is incorrect without asking. A judge failure (exception, wrong number of replies,
a reply that is neither verdict) is counted in `judge_errors` and left out of
`judge_accuracy`; it is never scored as incorrect.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re
from dataclasses import dataclass, field

from atomcli import schema, stats
from atomcli.stages import compare
from atomcli.config import opt, to_dict
from atomcli.errors import InputError
from atomcli.rewards import metrics

F1_VARIANTS = metrics.F1_VARIANTS
UNKNOWN_SOURCE = compare.NO_SOURCE
FIXED_DATE = "2026-01-01"  # the system prompt's date when nobody sets one: evals must not drift by day
PER_QUESTION_KEYS = ("f1", "em", "cover_em")
HISTORY_WAIT = 600.0  # seconds `eval --history` waits for another eval holding the same history (eval_history.locked)
DIGEST_CHARS = 16  # hex characters of a question's fingerprint (64 bits)

# Metrics averaged per question then over questions, in report order.
MEAN_KEYS = ("f1", "em", "cover_em", "format_error_rate", "mean_turns", "searches_per_question",
             "browses_per_question", "tokens_per_question", "generated_tokens_per_question")


@dataclass
class EvalConfig:
    model: str = opt("", "policy to roll out when INPUT holds questions only")
    search: str = opt("", "search SPEC for the rollout (with --model; default: the [rollout] section's, else ddg)")
    judge: str = opt("", "optional LLM judge SPEC for a correct/incorrect verdict next to F1")
    f1: str = opt(metrics.DEFAULT_F1, "F1 scorer: squad (SQuAD v1.1), hotpot (HotpotQA/FlashRAG), "
                                      "set (DeepResearcher); token = squad")
    greedy: bool = opt(True, "greedy decoding when rolling out", advanced=True)
    max_turns: int = opt(0, "turn cap when rolling out (0 = the [rollout] section's, else 10)", advanced=True)
    max_new_tokens: int = opt(0, "token cap per turn when rolling out (0 = the [rollout] section's, else 512)",
                              advanced=True)
    date: str = opt(FIXED_DATE, "date stated in the system prompt when rolling out (fixed, so that an eval "
                                "repeated on another day gives the same numbers; the [rollout] section's wins)",
                    advanced=True)
    seed: int = opt(0, "random seed")
    limit: int = opt(0, "evaluate only the first N questions (0 = all)")
    judge_batch: int = opt(32, "prompts per judge call (one failing call loses at most this many verdicts)",
                           advanced=True)
    # the rule at the turn cap as an *evaluation* rule, without the training rollouts using it (the learn
    # preset: the RL rollouts end at the cap, the evals of the SFT and of every step answer there)
    last_turn_note: bool = opt(False, "when rolling out: the note before the last turn that it must answer "
                                      "(on if the [rollout] section sets it)", advanced=True)
    force_answer: bool = opt(False, "when rolling out: a last turn that still calls a tool is followed by one "
                                    "forced answer turn (on if the [rollout] section sets it)")
    # the [rollout] settings (k, batch size, reader...) the questions are rolled out with; not a flag:
    # `atom eval --config FILE` reads FILE's [rollout] section, run-all passes its own
    rollout: dict = field(default_factory=dict)


def rollout_config(config: EvalConfig):
    """How eval rolls out questions: the [rollout] settings, then eval's own (one sample per question,
    greedy unless --no-greedy, eval's model/search/caps/seed/date). run-all uses this very function."""
    from atomcli import config as cfgmod
    from atomcli.stages import rollout
    base = cfgmod.build(rollout.RolloutConfig, config.rollout, source="[rollout] section")
    over = {"model": config.model, "group_size": 1, "seed": config.seed,
            "temperature": 0.0 if config.greedy else base.temperature}
    if config.search:
        over["search"] = config.search
    if config.max_turns:
        over["max_turns"] = config.max_turns
    if config.max_new_tokens:
        over["max_new_tokens"] = config.max_new_tokens
    if config.last_turn_note:
        over["last_turn_note"] = True
    if config.force_answer:
        over["force_answer"] = True
    if not base.date:
        over["date"] = config.date or FIXED_DATE
    return dataclasses.replace(base, **over)


def finish_report(table, config: EvalConfig, context, *, rolled_out: bool) -> dict:
    """The report of an answered table: scores, judge verdicts, what was evaluated and how."""
    report = score_table(table, config.f1)  # validates the table before any judge call is paid for
    if config.judge:
        report = score_table(table, config.f1, verdicts=judge_verdicts(table, config, context))
    report["kind"] = "questions" if rolled_out else "rollouts"
    report["model"] = config.model if rolled_out else _policies(table)
    report["config"] = to_dict(config)
    if rolled_out:
        report["rollout"] = to_dict(rollout_config(config))
    report["time"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return report


def run(table, config: EvalConfig, context) -> dict:
    """Score answered rollouts (or roll out `config.model` on questions first); the report dict."""
    table, rolled_out = answered(table, config, context)
    return finish_report(table, config, context, rolled_out=rolled_out)


def answered(table, config: EvalConfig, context):
    """(the answered table to score, whether it was rolled out here): the input itself when it holds
    answers, else its questions rolled out with `config.model` (`atom eval --answers` writes that table)."""
    _check_variant(config.f1)
    rolled_out = False
    if "answer" in table.column_names:
        if config.model:
            raise InputError("the input already holds answers (column `answer`) but --model was given",
                             column="answer", hint="drop --model to score these answers, "
                                                   "or pass the questions file to roll out a new model")
        table = _limit(table, config.limit)
    elif config.model:
        schema.require(table, "eval", None, schema.QUESTION_COLUMNS)
        table = _limit(table, config.limit)
        _unique_ids(table)
        table = _roll_out(table, config, context)
        rolled_out = True
    else:
        schema.require(table, "eval", None, ["id"])
        raise InputError("the input has no `answer` column: it holds questions, not answered rollouts",
                         column="answer", hint="pass --model M (and --search SPEC) to answer them, "
                                               "or give the output of `atom rollout`")
    return table, rolled_out


# --- scoring (pure) ---------------------------------------------------------------------------

def score_table(table, f1_variant: str = metrics.DEFAULT_F1, *, verdicts: list | None = None) -> dict:
    """The metrics of an answered table, overall and per `data_source`. Pure: no I/O, no clock.

    `verdicts`: optional judge verdict per row (True / False / None = judge failure)."""
    _check_variant(f1_variant)
    f1_variant = metrics.f1_scorer(f1_variant)  # token -> squad: the report names the scorer itself
    schema.require(table, "eval", None)
    cols = table.column_names
    ids = table.column("id").to_pylist()
    golds = table.column("golden_answers").to_pylist()
    answers = table.column("answer").to_pylist()
    sources = table.column("data_source").to_pylist() if "data_source" in cols else [None] * len(ids)
    texts = table.column("question").to_pylist() if "question" in cols else [None] * len(ids)
    get = {c: (table.column(c).to_pylist() if c in cols else None)
           for c in ("format_ok", "n_turns", "n_search", "n_browse", "completion_ids", "loss_mask")}
    if verdicts is not None and len(verdicts) != len(ids):
        raise ValueError(f"{len(verdicts)} verdicts for {len(ids)} rows")

    questions: dict[str, dict] = {}  # id -> {"source", "gold", "row", "samples": [per-row dict]}
    for i, (qid, gold, answer) in enumerate(zip(ids, golds, answers)):
        gold = [g for g in gold or [] if g is not None and str(g).strip()]  # "" would match any answer (cover-EM)
        if not gold:
            raise InputError("empty `golden_answers` (no non-blank answer)", row=i, column="golden_answers",
                             hint="every question needs at least one accepted answer")
        source = sources[i] if sources[i] is not None else UNKNOWN_SOURCE
        q = questions.get(qid)
        if q is None:
            q = questions[qid] = {"source": source, "gold": sorted(gold), "row": i, "samples": [],
                                  "text": texts[i]}
        elif q["gold"] != sorted(gold) or q["source"] != source:
            column = "golden_answers" if q["gold"] != sorted(gold) else "data_source"
            raise InputError(f"id `{qid}` has a different `{column}` here than in row {q['row']}", row=i,
                             column=column, hint="rows are matched to questions by id: one id, one question")
        q["samples"].append(_row_metrics(i, answer, gold, f1_variant, get, verdicts))

    by_source: dict[str, list[dict]] = {}
    for q in questions.values():
        by_source.setdefault(q["source"], []).append(q)
    judged = verdicts is not None
    return {
        "n": len(questions),
        "n_trajectories": len(ids),
        "f1_variant": f1_variant,
        "scorers": metrics.scorers(f1_variant),  # which official scorer each number comes from
        "overall": _bucket(list(questions.values()), judged),
        "by_source": {src: _bucket(qs, judged) for src, qs in sorted(by_source.items())},
        # what `eval --compare` pairs on: each question's mean over its samples, and what makes it the same
        # question (compare.same_question): its text and golden answers as digests, its source
        "per_question": {qid: {compare.SOURCE: q["source"], compare.QUESTION: _digest(q["text"]),
                               compare.GOLDS: _digest(q["gold"]),
                               **{k: stats.mean(s[k] for s in q["samples"]) for k in PER_QUESTION_KEYS}}
                         for qid, q in sorted(questions.items(), key=lambda kv: str(kv[0]))},
    }


def identities(table) -> dict:
    """What makes each question of a table the question it is (compare.same_question), as score_table records it:
    {id: {source, question digest, golden answers digest}}; for checking a --compare baseline before a rollout."""
    cols = table.column_names
    n = table.num_rows
    get = {c: table.column(c).to_pylist() if c in cols else [None] * n
           for c in ("id", "question", "golden_answers", "data_source")}
    out = {}
    for qid, text, gold, source in zip(get["id"], get["question"], get["golden_answers"], get["data_source"]):
        gold = sorted(g for g in gold or [] if g is not None and str(g).strip())
        out.setdefault(qid, {compare.SOURCE: source if source is not None else UNKNOWN_SOURCE,
                             compare.QUESTION: _digest(text), compare.GOLDS: _digest(gold) if gold else None})
    return out


def _digest(value) -> str | None:
    """A short stable fingerprint of a question's text or its (sorted) golden answers; None when absent."""
    if value is None:
        return None
    import hashlib
    import json
    return hashlib.sha256(json.dumps(value, ensure_ascii=False).encode()).hexdigest()[:DIGEST_CHARS]


def _row_metrics(i: int, answer, gold, variant: str, get: dict, verdicts) -> dict:
    def val(col):
        values = get[col]
        return None if values is None else values[i]

    fmt = val("format_ok")
    comp, mask = val("completion_ids"), val("loss_mask")
    return {
        "f1": metrics.f1(answer, gold, variant),
        "em": metrics.em(answer, gold),
        "cover_em": metrics.cover_em(answer, gold),
        "format_error_rate": None if fmt is None else float(not fmt),
        "mean_turns": val("n_turns"),
        "searches_per_question": val("n_search"),
        "browses_per_question": val("n_browse"),
        "tokens_per_question": None if comp is None else len(comp),
        # loss_mask = 1 exactly on the tokens the policy sampled
        "generated_tokens_per_question": None if mask is None else sum(mask),
        "verdict": None if verdicts is None else verdicts[i],
    }


def _bucket(questions: list[dict], judged: bool) -> dict:
    """Mean over questions of each question's mean over its samples."""
    out = {"n": len(questions), "n_trajectories": sum(len(q["samples"]) for q in questions)}
    out["samples_per_question"] = out["n_trajectories"] / out["n"]
    for key in MEAN_KEYS:
        out[key] = stats.mean(stats.mean(s[key] for s in q["samples"]) for q in questions)
    out["best_f1"] = stats.mean(max(s["f1"] for s in q["samples"]) for q in questions)
    if judged:
        verdicts = [s["verdict"] for q in questions for s in q["samples"]]
        out["judge_accuracy"] = stats.mean(stats.mean(s["verdict"] for s in q["samples"]) for q in questions)
        out["judge_n"] = sum(v is not None for v in verdicts)
        out["judge_errors"] = sum(v is None for v in verdicts)
    else:
        out["judge_accuracy"] = out["judge_n"] = out["judge_errors"] = None
    return out


# --- LLM judge --------------------------------------------------------------------------------

JUDGE_PROMPT = """You are grading the answer to a question. Decide whether the prediction gives the same answer as one of the golden answers. Ignore case, punctuation, word order and extra words that do not change the meaning; a prediction that is vaguer, different or hedges between answers is incorrect.

Question: {question}
Golden answers: {golden}
Prediction: {prediction}

Reply with one word: correct or incorrect."""

_VERDICT_RE = re.compile(r"\b(incorrect|correct)\b", re.I)


def judge_prompt(question, golden: list[str], prediction: str) -> str:
    return JUDGE_PROMPT.format(question=question or "(not given)", golden=" | ".join(golden),
                               prediction=prediction)


def parse_verdict(reply) -> bool | None:
    """True for "correct", False for "incorrect", None when the reply is neither."""
    if not isinstance(reply, str):
        return None
    m = _VERDICT_RE.search(reply)
    return None if m is None else m.group(1).lower() == "correct"


def judge_verdicts(table, config: EvalConfig, context) -> list[bool | None]:
    """One verdict per row: True/False, or None where the judge failed (counted, not scored)."""
    judge = context.judge(config.judge)
    cols = table.column_names
    questions = table.column("question").to_pylist() if "question" in cols else [None] * table.num_rows
    golds = table.column("golden_answers").to_pylist()
    answers = table.column("answer").to_pylist()
    verdicts: list[bool | None] = [False] * table.num_rows  # no answer: incorrect, no call needed
    asked = [i for i, a in enumerate(answers) if a is not None and a.strip()]
    size = max(1, config.judge_batch)
    errors: list[str] = []
    from atomcli import plugins
    from atomcli.progress import Progress
    with Progress(context, "eval judge", len(asked), "answers") as progress:
        for start in range(0, len(asked), size):
            rows = asked[start:start + size]
            prompts = [judge_prompt(questions[i], golds[i] or [], answers[i]) for i in rows]
            try:
                replies = plugins.judge_complete(judge, prompts, progress.advance)
                if len(replies) != len(prompts):
                    raise ValueError(f"judge returned {len(replies)} replies for {len(prompts)} prompts")
            except Exception as e:  # a judge fault loses these verdicts, never the run
                errors.append(f"{type(e).__name__}: {e}")
                replies = [None] * len(prompts)
            for i, reply in zip(rows, replies):
                verdicts[i] = parse_verdict(reply)
                if isinstance(reply, Exception):  # the judge interface returns per-prompt faults
                    errors.append(f"{type(reply).__name__}: {reply}")
            progress.update(completed=start + len(rows))
    failed = sum(verdicts[i] is None for i in asked)
    if failed:
        context.log(f"[yellow]judge[/] {config.judge}: no verdict for {failed} of {len(asked)} answers"
                    + (f" ({errors[0][:200]})" if errors else ""))
    return verdicts


# --- helpers ----------------------------------------------------------------------------------

def _check_variant(variant: str) -> None:
    if variant not in F1_VARIANTS:
        raise InputError(f"unknown F1 variant `{variant}`", hint="valid: " + ", ".join(F1_VARIANTS))


def _limit(table, limit: int):
    """Keep the rows of the first `limit` distinct ids (all samples of each)."""
    if not limit or limit <= 0 or "id" not in table.column_names:
        return table
    keep: dict = {}
    for qid in table.column("id").to_pylist():
        if len(keep) >= limit:
            break
        keep.setdefault(qid, None)
    rows = [i for i, qid in enumerate(table.column("id").to_pylist()) if qid in keep]
    return table.take(rows)


def _unique_ids(table) -> None:
    seen: dict = {}
    for i, qid in enumerate(table.column("id").to_pylist()):
        if qid in seen:
            raise InputError(f"duplicate question id `{qid}` (first in row {seen[qid]})", row=i, column="id",
                             hint="question ids must be unique")
        seen[qid] = i


def _roll_out(questions, config: EvalConfig, context):
    from atomcli.stages import rollout

    rcfg = rollout_config(config)
    context.log(f"eval: rolling out {config.model} on {questions.num_rows} questions "
                f"({'greedy' if config.greedy else 'sampled'}, search {rcfg.search}, k {rcfg.k}, "
                f"{rcfg.max_turns} turns x {rcfg.max_new_tokens} tokens, date {rcfg.date})")
    answered = rollout.run(questions, rcfg, context)
    got = set(answered.column("id").to_pylist()) if "id" in answered.column_names else set()
    missing = [q for q in questions.column("id").to_pylist() if q not in got]
    if missing:  # a rollout bug, not bad input: every question must come back (finish_reason=error at worst)
        raise RuntimeError(f"the rollout returned no trajectory for {len(missing)} question(s), e.g. `{missing[0]}`")
    return answered


def _policies(table):
    """The model(s) that wrote the answers, from the `policy` column."""
    if "policy" not in table.column_names:
        return None
    names = sorted({p for p in table.column("policy").to_pylist() if p})
    return names[0] if len(names) == 1 else (names or None)
