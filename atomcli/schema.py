"""The trajectory table contract (docs/design.md, "The trajectory table"): every column, its Arrow type, its owner.

One row per trajectory. A stage adds or replaces only the columns it owns and passes every
other column through untouched. `require()` fails at entry naming the missing column and
the stage that makes it. Provenance (stage, version, config, time, model/tokenizer) is kept
in the Parquet file metadata under the key `atomcli`, appended to by every stage.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass
from typing import Any, Iterable

import pyarrow as pa

from atomcli import __version__
from atomcli.errors import InputError

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
TOOL_CALL = pa.struct([
    ("turn", pa.int32()), ("name", pa.string()), ("arguments", pa.string()),
    ("ok", pa.bool_()), ("error", pa.string()), ("cached", pa.bool_()), ("seconds", pa.float64()),
])
ATOMIC_THOUGHT = pa.struct([
    ("turn", pa.int32()), ("tag", pa.string()), ("text", pa.string()), ("score", pa.float64()),
])


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    owner: str  # "input" or the stage (command name) that writes it
    doc: str


COLUMNS: dict[str, Column] = {c.name: c for c in [
    Column("id", pa.string(), "input", "question id (FlashRAG)"),
    Column("question", pa.string(), "input", "the question text"),
    Column("golden_answers", pa.list_(pa.string()), "input", "accepted answers"),
    Column("data_source", pa.string(), "input", "benchmark / split name, e.g. demo_2hop"),
    Column("traj_id", pa.string(), "rollout", "unique trajectory id: <group_id>/<sample_idx>"),
    Column("group_id", pa.string(), "rollout", "GRPO group (one question, G samples)"),
    Column("sample_idx", pa.int32(), "rollout", "index of the sample within its group"),
    Column("policy", pa.string(), "rollout", "model that produced the trajectory"),
    Column("policy_version", pa.string(), "rollout",
           "version of the served policy that answered (OpenAI engine with --policy-version, which run-all "
           "sets after each policy sync: the checkpoint's stage/step and a hash of its files); null for a "
           "policy loaded in-process (`policy` names its checkpoint)"),
    Column("messages", pa.list_(MESSAGE), "rollout", "system, user, assistant and tool turns"),
    Column("answer", pa.string(), "rollout", "text inside the final <answer>, null if none"),
    Column("finish_reason", pa.string(), "rollout", "answer | forced_answer | max_turns | length | error"),
    Column("format_ok", pa.bool_(), "rollout", "every turn well formed and ends with an answer"),
    Column("n_turns", pa.int32(), "rollout", "assistant turns"),
    Column("n_search", pa.int32(), "rollout", "web_search calls"),
    Column("n_browse", pa.int32(), "rollout", "browse_webpage calls"),
    Column("tool_calls", pa.list_(TOOL_CALL), "rollout", "every tool call, with its error if any"),
    Column("prompt_ids", pa.list_(pa.int32()), "rollout", "tokens of the first prompt"),
    Column("completion_ids", pa.list_(pa.int32()), "rollout", "every token after the first prompt"),
    Column("loss_mask", pa.list_(pa.int8()), "rollout", "1 = sampled by the policy, 0 = inserted"),
    Column("old_logprobs", pa.list_(pa.float32()), "rollout", "sampling log-probs (0 where mask 0)"),
    Column("atomic_thoughts", pa.list_(ATOMIC_THOUGHT), "score-rrm", "scored atomic thoughts"),
    Column("atr", pa.float64(), "score-rrm", "Atomic Thought Reward in [0,1]; null on judge error"),
    Column("rrm_judge", pa.string(), "score-rrm", "judge spec"),
    Column("rrm_error", pa.string(), "score-rrm", "judge failure, null when scored"),
    Column("turn_ig", pa.list_(pa.float64()), "score-ig",
           "per assistant turn: rise in the golden answer's probability (--ig prob) or log-prob; null on error"),
    Column("ig", pa.float64(), "score-ig", "sum of turn_ig (the rise over the whole episode); null on error"),
    Column("ig_error", pa.string(), "score-ig", "scoring failure, null when scored"),
    Column("f1", pa.float64(), "aggregate-reward", "token F1 against golden answers"),
    Column("em", pa.float64(), "aggregate-reward", "exact match"),
    Column("format_penalty", pa.float64(), "aggregate-reward", "-1 when ill formed, else 0"),
    Column("alpha", pa.float64(), "aggregate-reward", "weight of ATR at this step"),
    Column("reward", pa.float64(), "aggregate-reward", "alpha*atr + (1-alpha)*f1, or -1"),
    Column("advantage", pa.float64(), "aggregate-reward", "group-relative advantage"),
    Column("turn_advantages", pa.list_(pa.float64()), "aggregate-reward",
           "per assistant turn (--credit turn): what grpo-step gives that turn's sampled tokens"),
]}

QUESTION_COLUMNS = ["id", "question", "golden_answers"]
ROLLOUT_COLUMNS = [c for c, col in COLUMNS.items() if col.owner == "rollout"]
TOKEN_COLUMNS = ["prompt_ids", "completion_ids", "loss_mask", "old_logprobs"]

# What each stage needs at entry. eval accepts either answered rollouts or questions + --model.
STAGE_INPUTS: dict[str, list[str]] = {
    "rollout": QUESTION_COLUMNS,
    "score-rrm": ["question", "messages", "traj_id"],
    "score-ig": ["golden_answers", "prompt_ids", "completion_ids", "loss_mask", "traj_id"],
    "aggregate-reward": ["golden_answers", "group_id", "messages", "answer", "format_ok", "atr", "rrm_error"],
    "grpo-step": ["group_id", "prompt_ids", "completion_ids", "loss_mask", "old_logprobs", "advantage"],
    "sft": ["messages"],
    "rft": ["id", "golden_answers", "answer", "format_ok", "finish_reason", "messages"],
    "eval": ["id", "golden_answers", "answer"],
}


# Columns whose nulls mean something (no answer, a scorer's recorded failure): never refused at entry.
NULLABLE = ("answer", "policy_version", "atr", "rrm_error", "data_source", "turn_ig", "ig", "ig_error",
            "turn_advantages")


def missing_golden(table: pa.Table, context=None, stage: str = "", consequence: str = "") -> list[int]:
    """Rows whose `golden_answers` hold no usable answer (null, [], only nulls or blank strings).

    Such a row can only score 0 (or, for cover-EM, match anything): `context` gets one warning
    naming how many and the first, so that a silent 0 is never mistaken for a wrong answer."""
    if "golden_answers" not in table.column_names:
        return []
    rows = [i for i, g in enumerate(table.column("golden_answers").to_pylist())
            if not any(isinstance(a, str) and a.strip() for a in (g or []))]
    if rows and context is not None:
        context.log(f"[yellow]warning:[/] {stage + ': ' if stage else ''}{len(rows)} row(s) have no golden answer "
                    f"(empty or null `golden_answers`; first: row {rows[0]})" + (f"; {consequence}" if consequence else ""))
    return rows


def owner_of(column: str) -> str:
    col = COLUMNS.get(column)
    return col.owner if col else "unknown"


def require(table: pa.Table, stage: str, source: str = "-", columns: Iterable[str] | None = None) -> None:
    """Fail at entry if a column the stage needs is missing, naming the stage that makes it."""
    needed = list(columns) if columns is not None else STAGE_INPUTS[stage]
    if table.num_rows == 0:
        raise InputError("table is empty", file=source, hint=f"`atom {stage}` needs at least one row")
    for name in needed:
        if name not in table.column_names:
            owner = owner_of(name)
            hint = ("the input must be FlashRAG questions: {\"id\",\"question\",\"golden_answers\"}"
                    if owner == "input" else f"run `atom {owner}` first")
            raise InputError(f"missing (needed by `atom {stage}`)", file=source,
                             column=name, hint=hint)
        want = COLUMNS[name].type if name in COLUMNS else None
        got = table.schema.field(name).type
        if want is not None and not _compatible(got, want):
            raise InputError(f"column `{name}` has type {got}, expected {want}", file=source,
                             column=name, hint="was the table written by another tool?")
        if want is not None and name not in NULLABLE:
            nulls = table.column(name).null_count
            if nulls:
                row = next(i for i, v in enumerate(table.column(name).is_null().to_pylist()) if v)
                raise InputError(f"null value in required column `{name}`", file=source, row=row,
                                 column=name, hint=f"check the output of `atom {owner_of(name)}`")
    if stage in UNIQUE_TRAJ_STAGES and "traj_id" in table.column_names:
        _check_unique(table, "traj_id", source)


# Stages whose rows must be distinct trajectories: a repeated `traj_id` (two rollout tables
# concatenated, a row copied) would merge GRPO groups or count one trajectory twice. `sft`
# and `eval` accept repeats (rollouts of several steps pooled for rejection sampling).
UNIQUE_TRAJ_STAGES = ("score-rrm", "score-ig", "aggregate-reward", "grpo-step")


def _check_unique(table: pa.Table, name: str, source: str) -> None:
    first: dict = {}
    for row, value in enumerate(table.column(name).to_pylist()):
        if value is None:
            continue
        if value in first:
            raise InputError(f"duplicate `{name}` {value!r} (first in row {first[value]})", file=source,
                             row=row, column=name, hint="each trajectory must appear once; were two rollout "
                             "tables concatenated? give each rollout its own --out")
        first[value] = row


def _compatible(got: pa.DataType, want: pa.DataType) -> bool:
    if got == want or pa.types.is_null(got):
        return True
    num = (pa.types.is_integer, pa.types.is_floating)
    if any(f(got) for f in num) and any(f(want) for f in num):
        return True
    if pa.types.is_string(want) and (pa.types.is_large_string(got) or pa.types.is_string(got)):
        return True
    if (pa.types.is_list(want) or pa.types.is_large_list(want)) and \
            (pa.types.is_list(got) or pa.types.is_large_list(got)):
        return _compatible(got.value_type, want.value_type)
    if pa.types.is_struct(want) and pa.types.is_struct(got):
        return True
    return False


def conform(table: pa.Table, source: str = "-") -> pa.Table:
    """Cast known columns to their contract type (JSONL inference gives int64, large lists...)."""
    for i, name in enumerate(table.column_names):
        col = COLUMNS.get(name)
        if col is None or table.schema.field(name).type == col.type:
            continue
        try:
            table = table.set_column(i, pa.field(name, col.type), table.column(name).cast(col.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise InputError(f"column `{name}` cannot be read as {col.type}: {str(e).splitlines()[0]}",
                             file=source, column=name, hint="fix the column's values or types") from None
    return table


def array(name: str, values: list) -> pa.Array:
    """Build a column of the contract type (or inferred for columns outside the contract)."""
    col = COLUMNS.get(name)
    if col and pa.types.is_list(col.type) and any(isinstance(v, (str, bytes)) for v in values):
        # pyarrow would silently split "Paris" into ["P", "a", "r", "i", "s"]
        raise ValueError(f"column `{name}`: expected a list, got a string")
    try:
        return pa.array(values, type=col.type) if col else pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ValueError(f"column `{name}`: {e}") from e


def set_columns(table: pa.Table, values: dict[str, list]) -> pa.Table:
    """Add or replace columns, keeping every other column (and its position) untouched."""
    for name, vals in values.items():
        arr = array(name, vals)
        field = pa.field(name, arr.type)
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), field, arr)
        else:
            table = table.append_column(field, arr)
    return table


# --- provenance -------------------------------------------------------------------------

META_KEY = b"atomcli"


def provenance(table: pa.Table) -> list[dict]:
    meta = table.schema.metadata or {}
    raw = meta.get(META_KEY)
    if not raw:
        return []
    try:
        return json.loads(raw).get("provenance", [])
    except ValueError:
        return []


def with_provenance(table: pa.Table, stage: str, config: Any = None, *, model: str | None = None,
                    tokenizer: str | None = None, extra: dict | None = None,
                    inherit: pa.Table | None = None) -> pa.Table:
    """Append one provenance record for `stage` to the table's metadata.

    `inherit`: the stage's input table, whose records come first (tables built fresh by a stage
    lose their schema metadata otherwise)."""
    records = provenance(inherit if inherit is not None else table)
    rec = {"stage": stage, "version": __version__,
           "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "config": _jsonable(config)}
    if model is not None:
        rec["model"] = model
    if tokenizer is not None:
        rec["tokenizer"] = tokenizer
    if extra:
        rec.update(_jsonable(extra))
    records.append(rec)
    meta = dict(table.schema.metadata or {})
    meta[META_KEY] = json.dumps({"provenance": records}).encode()
    return table.replace_schema_metadata(meta)


def token_source(table: pa.Table) -> dict | None:
    """The last provenance record that names the tokenizer the token columns belong to."""
    for rec in reversed(provenance(table)):
        if rec.get("tokenizer"):
            return rec
    return None


def _jsonable(obj: Any) -> Any:
    import dataclasses
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()
                if not _secret(str(k))}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return str(obj)


def _secret(key: str) -> bool:
    """Config keys that may hold credentials are never written to metadata."""
    k = key.lower()
    return any(s in k for s in ("api_key", "apikey", "token_value", "password", "secret"))
