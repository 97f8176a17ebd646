"""Stage `score-ig`: information-gain turn rewards (IGPO), from the policy itself, no judge.

Owns `turn_ig`, `ig`, `ig_error` (docs/design.md, "Rewards and advantages"). The mechanics
(contexts, the forced answer turn, the forward passes) live in `atomcli.rewards.info_gain`.

For every trajectory, after the bare question (context 0) and after each assistant turn t
(its context ends where turn t+1's sampled tokens start: the turn, the tool response, the
next turn's opening; after the last turn, the whole trajectory and a newly opened assistant
turn), the scoring model is teacher-forced the answer turn
`<think><REFLECTION>I have enough information to answer.</REFLECTION></think><answer>GOLD</answer>`
and score(t) = the mean log-probability of GOLD's tokens; with several golden aliases the
best one counts, per context. Then

    turn_ig[t] = v(t) - v(t-1)    t = 1..T, one value per assistant turn
    v = exp(score)                --ig prob (default, IGPO's prob_diff): a per-token probability in [0, 1]
    v = score                     --ig logprob (IGPO's log_prob_diff): unbounded
    ig = sum(turn_ig) = v(T) - v(0)

`ig` is the sum, not the mean: the gains telescope, so `ig` is the total rise over the
episode whatever the number of turns (a mean would pay a trajectory for taking fewer
turns). With `--ig prob` it lies in [-1, 1], on the scale of F1, which is why prob is the
default: `aggregate-reward --process ig` fuses it with F1 under the alpha schedule. The
last turn's gain includes what the model's own final answer does to its belief in the
golden one (a right answer raises it, a wrong one usually lowers it).

The scoring model defaults to the policy that made the rollouts (the `policy` column, else
the rollout's provenance), which IGPO uses; `--model` picks another one that shares its
tokenizer (the token columns are scored as they are, never re-tokenized). The model that
scored is recorded in the provenance (`config.model`). A trajectory with no assistant turn
gets `turn_ig` [] and `ig` 0.0 (nothing to reward, not a failure). A failure (no usable
golden answer, a context longer than the model's positions, `loss_mask` runs that disagree
with `n_turns`, a non-finite score) sets `ig_error` and leaves `turn_ig`/`ig` null, never 0;
`aggregate-reward` then falls back to the outcome reward for that row and counts it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.markup import escape

from atomcli import schema, stats
from atomcli.agent import format as agent_format
from atomcli.agent.episode import FORCED_ANSWER, Chat, turn_spans
from atomcli.config import opt
from atomcli.errors import InputError, unknown_choice
from atomcli.rewards import info_gain
from atomcli.train import accel

IG_MODES = ("prob", "logprob")
CHUNK = 256  # trajectories whose contexts are built and scored at once (bounds memory on large tables)


@dataclass
class IGConfig:
    model: str = opt("", "scoring model: a checkpoint folder or smollm2 (default: the policy that made the "
                         "rollouts, from the `policy` column or the provenance)")
    ig: str = opt("prob", "turn reward: prob (gain in the answer's per-token probability, IGPO's default; `ig` in "
                          "[-1, 1]) or logprob (gain in its mean log-prob; unbounded)")
    reuse_prefix: bool = opt(True, "one pass over each trajectory into a KV cache, then only the forced answers "
                                   "(off: every context as its own batched sequence)", advanced=True)
    batch_size: int = opt(8, "sequences per forward pass with --no-reuse-prefix", advanced=True)
    device: str = opt("", "torch device for the scoring model (cpu, cuda, cuda:1; default: where it loads)")
    precision: str = opt("auto", "the scoring passes: auto (bf16 on a GPU, else fp32), bf16 (autocast: fp32 "
                                 "weights, bf16 matmuls; faster on a CPU with AMX) or fp32",
                         advanced=True)
    trust_remote_code: bool = opt(False, "allow model code from the checkpoint to run", advanced=True)


def _validate(config: IGConfig) -> None:
    accel.check_precision(config.precision)
    if config.ig not in IG_MODES:
        raise unknown_choice("--ig mode", config.ig, IG_MODES)
    if config.batch_size < 1:
        raise InputError(f"--batch-size must be >= 1 (got {config.batch_size})")


def scoring_model(table, config: IGConfig) -> str:
    """The model spec to score with: --model, else the policy that made the rollouts."""
    if config.model:
        return config.model
    spec = None
    if "policy" in table.column_names:
        policies = {p for p in table.column("policy").to_pylist() if p}
        if len(policies) > 1:
            raise InputError(f"the rows come from {len(policies)} policies ({', '.join(sorted(policies)[:3])}…)",
                             column="policy", hint="pass --model: the information gain needs one scoring model")
        spec = next(iter(policies), None)
    if spec is None:
        spec = next((r.get("model") for r in reversed(schema.provenance(table)) if r.get("stage") == "rollout"), None)
    if not spec:
        raise InputError("the table does not say which policy made it", column="policy", hint="pass --model")
    if spec.startswith("openai:"):
        raise InputError(f"the rollouts came from a served model ({spec}); scoring needs its weights here",
                         column="policy", hint="pass --model with the same model's local checkpoint")
    return spec


def run(table, config: IGConfig, context):
    """Score every trajectory. `config.model` is resolved in place, so provenance names the scoring model."""
    _validate(config)
    schema.require(table, "score-ig")
    spec = scoring_model(table, config)
    config.model = spec
    t0 = time.time()

    from atomcli import models
    kw = {"trust_remote_code": True} if config.trust_remote_code else {}
    if config.device:
        kw["device"] = config.device
    model, tok = context.model(spec, **kw)  # the rollout's own model object when run-all shares the context
    rec = schema.token_source(table)
    if rec is not None and rec["tokenizer"] != models.tokenizer_id(tok):
        raise InputError(f"token columns were made with tokenizer {rec['tokenizer']} (model {rec.get('model', '?')}), "
                         f"the scoring model's is {models.tokenizer_id(tok)}", column="completion_ids",
                         hint="score with a model that shares the policy's tokenizer (the default: the policy)")
    chat = Chat(tok)
    template = info_gain.template_texts(chat)
    precision = accel.resolve_precision(config.precision)
    amp = accel.autocast(model, precision)
    context.log(f"score-ig: {table.num_rows} trajectories -> {escape(spec)} (--ig {config.ig}, {precision})")

    turn_ig: list = []
    ig: list = []
    errors: list = []
    first: list = []   # the bare-question value v(0) of every scored row, for the summary
    from atomcli.progress import Progress
    with Progress(context, "score-ig", table.num_rows, "trajectories") as progress:
        for start in range(0, table.num_rows, CHUNK):
            part = table.slice(start, CHUNK)
            cols = {c: part.column(c).to_pylist() if c in part.column_names else [None] * part.num_rows
                    for c in ("prompt_ids", "completion_ids", "loss_mask", "golden_answers", "messages", "n_turns",
                              "finish_reason")}
            jobs, where, row_err = [], {}, {}
            for i in range(part.num_rows):
                try:
                    jobs.append(_job(chat, tok, template, {c: v[i] for c, v in cols.items()}))
                    where[i] = len(jobs) - 1
                except ValueError as e:
                    row_err[i] = str(e)
            progress.advance(len(row_err))
            with amp:
                scored = info_gain.score_jobs(model, jobs, batch_size=config.batch_size,
                                              reuse_prefix=config.reuse_prefix, progress=progress.advance)
            for i in range(part.num_rows):
                res = scored[where[i]] if i in where else ValueError(row_err[i])
                if isinstance(res, Exception):
                    turn_ig.append(None)
                    ig.append(None)
                    errors.append((str(res) if isinstance(res, ValueError) else f"{type(res).__name__}: {res}")[:500])
                    continue
                best = [max(per_alias) for per_alias in res]
                gains = info_gain.gains(best, config.ig)
                turn_ig.append(gains)
                ig.append(float(sum(gains)))
                errors.append(None)
                first.append(best[0])
            progress.update(completed=start + part.num_rows, info=f"errors {sum(e is not None for e in errors)}")
    _summary(context, spec, config.ig, turn_ig, ig, errors, first, time.time() - t0)
    return schema.set_columns(table, {"turn_ig": turn_ig, "ig": ig, "ig_error": errors})


def _job(chat, tok, template, row: dict):
    """One trajectory's scoring job; ValueError (the row's `ig_error`) when it cannot be scored."""
    prompt, comp, mask = row["prompt_ids"], row["completion_ids"], row["loss_mask"]
    if not prompt:
        raise ValueError("`prompt_ids` is empty: there is no question to score the answer after")
    if len(mask) != len(comp):
        raise ValueError(f"`loss_mask` has {len(mask)} entries but `completion_ids` has {len(comp)}")
    answers = info_gain.forced_answers(tok, row["golden_answers"], template)
    if not answers:
        raise ValueError("no golden answer to score (`golden_answers` is empty or blank)")
    n_runs = len(turn_spans(mask))
    if row["n_turns"] is not None and n_runs != row["n_turns"]:
        raise ValueError(f"`loss_mask` has {n_runs} runs of sampled tokens but `n_turns` is {row['n_turns']}: "
                         "the turns cannot be told apart")
    tail = info_gain.tail_ids(chat, list(prompt) + list(comp), row["messages"], template) if n_runs else []
    # a forced answer turn (rollout --force-answer) starts with the head the environment wrote: the
    # context before it ends before that head, as every other turn's ends at its opening
    head = len(chat.encode(agent_format.forced_answer_head())) if row.get("finish_reason") == FORCED_ANSWER else 0
    ids, ends = info_gain.contexts(prompt, comp, mask, tail, head=head)
    return info_gain.Job(ids, ends, answers)


def _summary(context, spec, mode, turn_ig, ig, errors, first, seconds) -> None:
    import math
    scored = [x for x in ig if x is not None]
    n_err = sum(e is not None for e in errors)
    turns = sum(len(t) for t in turn_ig if t is not None)
    mean = stats.mean(scored)
    mean = float("nan") if mean is None else mean
    base = (sum(math.exp(s) if mode == "prob" else s for s in first) / len(first)) if first else float("nan")
    color = "yellow" if n_err else "green"
    context.log(f"[{color}]score-ig[/] {escape(spec)}: {len(ig)} trajectories, {turns} turns, "
                f"mean answer {'probability' if mode == 'prob' else 'log-prob'} after the question {base:.4f}, "
                f"mean ig {mean:+.4f}, errors {n_err}, {seconds:.1f} s")
    context.log_first_error("ig", errors)
