"""Hardening: bad input to every stage gives exit 2, one line naming file/row/column with a
hint, nothing on stdout and no output file (docs/RELIABILITY.md, "Bad input").

The tables come from a real (tiny) pipeline: rollout -> score-rrm -> aggregate-reward with the
tiny random model, so every bad variant below is a damaged copy of a table the stages accept.
The command matrix runs in-process through typer's CliRunner (40 ms a call instead of a
subprocess start); `test_real_process_*` pins the same guarantee on the real entry point.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import atom
from typer.testing import CliRunner

from atomcli import models, schema, tableio
from atomcli.cli import app
from atomcli.context import Context
from atomcli.env import search_local
from atomcli.errors import InputError
from atomcli.stages import (
    aggregate_reward,
    grpo_step,
    rollout,
    rollout_io,
    score_rrm,
    sft,
)

CORPUS = [{"id": "d1", "title": "Alice Smith", "contents": "Alice Smith was born in Paris in 1901."},
          {"id": "d2", "title": "Bob Jones", "contents": "Bob Jones lives in Rome and writes novels."}]


@pytest.fixture(scope="module")
def pipe(tiny_model, tmp_path_factory):
    """Real rollouts/scored/rewarded tables (3 questions x 2 samples) and their paths."""
    d = tmp_path_factory.mktemp("pipe")
    (d / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    search_local.build_index(str(d / "corpus.jsonl"), str(d / "idx.sqlite"))
    questions = pa.table({"id": ["q0", "q1", "q2"], "question": [f"Where was person {i} born?" for i in range(3)],
                          "golden_answers": [["Paris"]] * 3})
    ctx = Context(quiet=True)
    cfg = rollout.RolloutConfig(model=str(tiny_model), search=f"local:{d / 'idx.sqlite'}", group_size=2,
                                max_turns=2, max_new_tokens=8, date="2026-01-01", batch_size=8)
    rollout_io.run_to_file(rollout, questions, cfg, ctx, out=str(d / "rollouts.parquet"), fmt=None, resume=False)
    rolled = tableio.read_table(str(d / "rollouts.parquet"))
    scfg = score_rrm.ScoreConfig(judge="heuristic")
    tableio.write_stage(score_rrm.run(rolled, scfg, ctx), str(d / "scored.parquet"), "score-rrm", scfg, inherit=rolled)
    scored = tableio.read_table(str(d / "scored.parquet"))
    acfg = aggregate_reward.AggregateConfig(step=0, total_steps=2)
    tableio.write_stage(aggregate_reward.run(scored, acfg, ctx), str(d / "rewarded.parquet"), "aggregate-reward",
                        acfg, inherit=scored)
    rewarded = tableio.read_table(str(d / "rewarded.parquet"))
    assert rewarded.num_rows == 6 and schema.token_source(rewarded)["stage"] == "rollout"
    return SimpleNamespace(dir=d, model=tiny_model, index=d / "idx.sqlite", rewarded=rewarded,
                           rewarded_path=d / "rewarded.parquet", ctx=ctx)


# --- helpers ---------------------------------------------------------------------------------------

def cli(*args, input: bytes | None = None):
    res = CliRunner().invoke(app, [str(a) for a in args], input=input)
    return res.exit_code, res.stdout, res.stderr


def stage_args(stage: str, pipe, src, out) -> list:
    """The command line that runs `stage` on `src`, writing `out` (every stage reaches its input check)."""
    return {
        "rollout": ["rollout", src, "--model", pipe.model, "--search", f"local:{pipe.index}", "--out", out,
                    "--group-size", 1, "--max-turns", 1, "--max-new-tokens", 2],
        "score-rrm": ["score-rrm", src, "--out", out, "--judge", "heuristic"],
        "aggregate-reward": ["aggregate-reward", src, "--out", out, "--step", 0, "--total-steps", 2],
        "grpo-step": ["grpo-step", src, "--model", pipe.model, "--out", out],
        "sft": ["sft", src, "--model", pipe.model, "--out", out, "--epochs", 1],
        "eval": ["eval", src, "--out", out],
        "show": ["show", src, "--html", out],
    }[stage]


STAGES = ["rollout", "score-rrm", "aggregate-reward", "grpo-step", "sft", "eval", "show"]


def assert_refused(result, out: Path, *, file: str, row: int | None = None, column: str | None = None,
                   words: tuple = (), after_load: bool = False) -> str:
    """exit 2, stdout empty, exactly one stderr line naming file/row/column with a hint, no output."""
    code, stdout, stderr = result
    lines = [ln for ln in stderr.replace("\r", "\n").splitlines() if ln.strip()]
    assert code == 2, stderr
    assert stdout == ""
    # stages that fail after loading the model may log progress or notes first; the error is
    # one line, and the last
    assert [ln for ln in lines if ln.startswith("error:")] == lines[-1:], stderr
    if not after_load:
        assert len(lines) == 1, stderr
    line = lines[-1]
    assert line.startswith("error: ") and str(file) in line and "(hint: " in line, line
    if row is not None:
        assert f"row {row}" in line, line
    if column is not None:
        assert f"column `{column}`" in line, line
    for w in words:
        assert w in line, line
    assert not out.exists()
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]
    assert leftovers == [], leftovers  # no temporary or partial file either
    return line


def with_column(table: pa.Table, name: str, values: list) -> pa.Table:
    """`table` with one column replaced (provenance metadata kept)."""
    arr = schema.array(name, values)
    i = table.column_names.index(name)
    return table.set_column(i, pa.field(name, arr.type), arr).replace_schema_metadata(table.schema.metadata)


def write(table: pa.Table, path: Path) -> Path:
    pq.write_table(table, path)
    return path


# --- file-level damage: every stage, the same one-line refusal ---------------------------------------

def _truncated(pipe, d):
    raw = pipe.rewarded_path.read_bytes()
    (d / "bad.parquet").write_bytes(raw[: len(raw) // 2])
    return d / "bad.parquet", {}


def _corrupted(pipe, d):
    raw = bytearray(pipe.rewarded_path.read_bytes())
    mid = len(raw) // 3
    raw[mid:mid + 64] = bytes(b ^ 0xFF for b in raw[mid:mid + 64])  # footer intact, a data page broken
    (d / "bad.parquet").write_bytes(bytes(raw))
    return d / "bad.parquet", {}


def _jsonl_rows(pipe):
    return [json.dumps(r, ensure_ascii=False).encode() for r in pipe.rewarded.to_pylist()]


def _broken_line(pipe, d):
    lines = _jsonl_rows(pipe)
    lines[2] = lines[2][:40]  # cut mid-object, as a killed writer would leave it
    (d / "bad.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return d / "bad.jsonl", {"row": 2}


def _non_utf8(pipe, d):
    lines = _jsonl_rows(pipe)
    lines[1] = lines[1].replace(b"Where", b"Wh\xff\xfere")  # latin-1 bytes inside a string
    (d / "bad.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return d / "bad.jsonl", {"row": 1, "words": ("UTF-8",)}


def _empty_file(pipe, d):
    (d / "bad.jsonl").write_bytes(b"")
    return d / "bad.jsonl", {"words": ("empty",)}


def _zero_rows(pipe, d):
    return write(pipe.rewarded.slice(0, 0), d / "bad.parquet"), {"words": ("empty",)}


def _wrong_type_parquet(pipe, d):
    t = pipe.rewarded
    arr = pa.array(["x"] * t.num_rows)
    t = t.set_column(t.column_names.index("golden_answers"), pa.field("golden_answers", arr.type), arr)
    return write(t, d / "bad.parquet"), {"column": "golden_answers"}


def _wrong_type_jsonl(pipe, d):
    rows = pipe.rewarded.to_pylist()
    rows[3]["golden_answers"] = "Paris"  # a string where a list belongs (pyarrow would split it into letters)
    (d / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d / "bad.jsonl", {"row": 3, "column": "golden_answers"}


FILE_CASES = {"truncated-parquet": _truncated, "corrupted-parquet": _corrupted, "jsonl-broken-line": _broken_line,
              "non-utf8": _non_utf8, "empty-file": _empty_file, "zero-rows": _zero_rows,
              "wrong-type-parquet": _wrong_type_parquet, "wrong-type-jsonl": _wrong_type_jsonl}


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("case", list(FILE_CASES))
def test_damaged_file_is_refused_by_every_stage(pipe, tmp_path, case, stage):
    src, where = FILE_CASES[case](pipe, tmp_path)
    out = tmp_path / "out" / "result"
    out.parent.mkdir()
    assert_refused(cli(*stage_args(stage, pipe, src, out)), out, file=src, **where)


def test_damaged_stdin_is_named_stdin(pipe, tmp_path):
    src, _ = _broken_line(pipe, tmp_path)
    out = tmp_path / "r.parquet"
    assert_refused(cli("aggregate-reward", "-", "--out", out, "--step", 0, "--total-steps", 2,
                       input=src.read_bytes()), out, file="<stdin>", row=2)


def test_real_process_exits_2_with_one_line_and_empty_stdout(pipe, tmp_path):
    src, _ = _corrupted(pipe, tmp_path)
    out = tmp_path / "r.parquet"
    proc = atom("score-rrm", src, "--out", out)
    assert_refused((proc.returncode, proc.stdout.decode(), proc.stderr.decode()), out, file=src)
    proc = atom("score-rrm", "-", "--out", "-", input=src.read_bytes())
    assert proc.returncode == 2 and proc.stdout == b"" and b"<stdin>" in proc.stderr


# --- content-level damage: the stages that use the damaged column refuse it -------------------------

def test_token_columns_of_unequal_length(pipe, tmp_path):
    mask = pipe.rewarded.column("loss_mask").to_pylist()
    mask[4] = mask[4][:-3]
    src = write(with_column(pipe.rewarded, "loss_mask", mask), tmp_path / "t.parquet")
    for stage in ("grpo-step", "sft"):  # sft: the tokenizer matches, so it trains on the token columns
        out = tmp_path / f"{stage}-out"
        assert_refused(cli(*stage_args(stage, pipe, src, out)), out, file=src, row=4, column="loss_mask",
                       after_load=stage == "sft")
    old = pipe.rewarded.column("old_logprobs").to_pylist()
    old[1] = old[1] + [0.0]
    src = write(with_column(pipe.rewarded, "old_logprobs", old), tmp_path / "o.parquet")
    out = tmp_path / "g2"
    assert_refused(cli(*stage_args("grpo-step", pipe, src, out)), out, file=src, row=1, column="old_logprobs")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_advantage_is_refused_by_grpo_step(pipe, tmp_path, value):
    adv = pipe.rewarded.column("advantage").to_pylist()
    adv[2] = value
    src = write(with_column(pipe.rewarded, "advantage", adv), tmp_path / "a.parquet")
    out = tmp_path / "ckpt"
    assert_refused(cli(*stage_args("grpo-step", pipe, src, out)), out, file=src, row=2, column="advantage")


def test_non_finite_old_logprob_of_a_sampled_token_is_refused(pipe, tmp_path):
    old = pipe.rewarded.column("old_logprobs").to_pylist()
    mask = pipe.rewarded.column("loss_mask").to_pylist()
    j = mask[3].index(1)
    old[3] = old[3][:j] + [float("nan")] + old[3][j + 1:]
    src = write(with_column(pipe.rewarded, "old_logprobs", old), tmp_path / "a.parquet")
    out = tmp_path / "ckpt"
    assert_refused(cli(*stage_args("grpo-step", pipe, src, out)), out, file=src, row=3, column="old_logprobs")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1.5])
def test_bad_atr_is_refused_by_aggregate_reward(pipe, tmp_path, value):
    atr = pipe.rewarded.column("atr").to_pylist()
    atr[1] = value
    src = write(with_column(pipe.rewarded, "atr", atr), tmp_path / "s.parquet")
    out = tmp_path / "w.parquet"
    assert_refused(cli(*stage_args("aggregate-reward", pipe, src, out)), out, file=src, row=1, column="atr")


def test_non_finite_reward_does_not_reach_the_grpo_update(pipe):
    """grpo-step trains on `advantage`, not `reward`: an inf reward is only left out of the logged stats."""
    reward = pipe.rewarded.column("reward").to_pylist()
    reward[0] = float("inf")
    batch = grpo_step.read_batch(with_column(pipe.rewarded, "reward", reward))
    finite = [r for r in reward if r != float("inf")]
    assert batch.stats["reward_mean"] == pytest.approx(sum(finite) / len(finite))


@pytest.mark.parametrize("stage", ["score-rrm", "aggregate-reward", "grpo-step"])
def test_duplicate_traj_id_is_refused(pipe, tmp_path, stage):
    tid = pipe.rewarded.column("traj_id").to_pylist()
    tid[3] = tid[2]
    src = write(with_column(pipe.rewarded, "traj_id", tid), tmp_path / "d.parquet")
    out = tmp_path / "out"
    assert_refused(cli(*stage_args(stage, pipe, src, out)), out, file=src, row=3, column="traj_id",
                   words=(repr(tid[2]), "first in row 2"))


def test_two_concatenated_rollouts_are_refused_before_groups_merge(pipe, tmp_path):
    both = pa.concat_tables([pipe.rewarded, pipe.rewarded])
    src = write(both, tmp_path / "both.parquet")
    out = tmp_path / "w.parquet"
    assert_refused(cli(*stage_args("aggregate-reward", pipe, src, out)), out, file=src, row=6, column="traj_id")


def test_table_from_another_tokenizer_is_refused_by_grpo_step(pipe, tmp_path):
    meta = json.loads(pipe.rewarded.schema.metadata[schema.META_KEY])
    for rec in meta["provenance"]:
        if rec.get("tokenizer"):
            rec["tokenizer"] = "Qwen2TokenizerFast:151665:0123456789ab"
    other = pipe.rewarded.replace_schema_metadata({schema.META_KEY: json.dumps(meta).encode()})
    src = write(other, tmp_path / "other.parquet")
    out = tmp_path / "ckpt"
    line = assert_refused(cli(*stage_args("grpo-step", pipe, src, out)), out, file=src, column="completion_ids",
                          words=("Qwen2TokenizerFast:151665:0123456789ab",), after_load=True)
    assert models.tokenizer_id(pipe.ctx.model(str(pipe.model))[1]) in line  # and names the policy's own


def test_table_from_another_tokenizer_is_re_rendered_by_sft(pipe):
    """sft never trains on foreign token ids: it falls back to rendering `messages` with its own template."""
    meta = json.loads(pipe.rewarded.schema.metadata[schema.META_KEY])
    for rec in meta["provenance"]:
        if rec.get("tokenizer"):
            rec["tokenizer"] = "Other:1:x"
    other = pipe.rewarded.replace_schema_metadata({schema.META_KEY: json.dumps(meta).encode()})
    tok = pipe.ctx.model(str(pipe.model))[1]
    assert sft.build_examples(other, tok)[1] == "chat template"
    assert sft.build_examples(pipe.rewarded, tok)[1] == "token columns"


def test_token_id_outside_the_vocabulary_is_refused(pipe, tmp_path):
    comp = pipe.rewarded.column("completion_ids").to_pylist()
    comp[0] = [10**6] + comp[0][1:]
    bare = with_column(pipe.rewarded, "completion_ids", comp).replace_schema_metadata(None)  # no provenance
    src = write(bare, tmp_path / "v.parquet")
    out = tmp_path / "ckpt"
    assert_refused(cli(*stage_args("grpo-step", pipe, src, out)), out, file=src, column="completion_ids",
                   words=("1000000", "vocabulary"), after_load=True)


def test_null_in_a_required_column_names_its_row(pipe, tmp_path):
    prompts = pipe.rewarded.column("prompt_ids").to_pylist()
    prompts[4] = None
    src = write(with_column(pipe.rewarded, "prompt_ids", prompts), tmp_path / "n.parquet")
    out = tmp_path / "ckpt"
    assert_refused(cli(*stage_args("grpo-step", pipe, src, out)), out, file=src, row=4, column="prompt_ids")


def test_group_of_one_warns_counts_and_gets_zero_advantage(pipe, tmp_path):
    """Decision (aggregate-reward's owner and this issue): a group of size 1 is not an error. Its
    advantage is 0 (no group to compare with, so no learning signal); the run warns and counts them."""
    t = pipe.rewarded.filter(pa.compute.not_equal(pipe.rewarded.column("traj_id"), "q1/1"))  # q1 keeps one sample
    src = write(t, tmp_path / "s.parquet")
    out = tmp_path / "w.parquet"
    code, stdout, stderr = cli(*stage_args("aggregate-reward", pipe, src, out))
    assert code == 0, stderr
    assert "1 group(s) of size 1" in " ".join(stderr.split())
    got = pq.read_table(out).to_pylist()
    assert [r["advantage"] for r in got if r["group_id"] == "q1"] == [0.0]
    assert len(got) == 5


# --- inputs of the other commands -------------------------------------------------------------------

def _corpus_parquet(d: Path, corrupt: bool) -> Path:
    n = 3000
    t = pa.table({"id": [f"d{i}" for i in range(n)], "title": ["t"] * n,
                  "contents": [f"text number {i} " * 20 for i in range(n)]})
    path = d / "corpus.parquet"
    pq.write_table(t, path, compression="none")
    if corrupt:
        raw = bytearray(path.read_bytes())
        mid = len(raw) // 3
        raw[mid:mid + 4096] = b"\xff" * 4096  # footer intact: only decoding the page finds the damage
        path.write_bytes(bytes(raw))
    return path


def test_corrupted_parquet_corpus_is_refused_by_index(tmp_path):
    src = _corpus_parquet(tmp_path, corrupt=True)
    out = tmp_path / "idx.sqlite"
    assert_refused(cli("index", src, "--out", out), out, file=src, words=("corrupt",))


@pytest.mark.parametrize("content, where", [
    (b'{"id": "a", "contents": "x"}\n{"id": "b", "contents": \n', {"row": 1}),
    (b'{"id": "a", "contents": "caf\xe9"}\n', {"row": 0, "words": ("UTF-8",)}),
    (b'{"id": "a", "contents": "x"}\n{"id": "a", "contents": "y"}\n', {"row": 1, "column": "id"}),
    (b'{"id": "a", "contents": 3}\n', {"row": 0, "column": "contents"}),
    (b"", {"words": ("no documents",)}),
])
def test_bad_corpus_is_refused_by_index(tmp_path, content, where):
    src = tmp_path / "corpus.jsonl"
    src.write_bytes(content)
    out = tmp_path / "idx.sqlite"
    assert_refused(cli("index", src, "--out", out), out, file=src, **where)


def test_run_all_with_a_damaged_question_file_writes_nothing_and_can_be_rerun(pipe, tmp_path):
    bad, _ = _broken_line(pipe, tmp_path)
    config = tmp_path / "run.toml"
    config.write_text(f'[run-all]\nmodel = "{pipe.model}"\ntrain = "{bad}"\ntest = "{bad}"\n'
                      f'search = "local:{pipe.index}"\nsft_data = ""\n')
    run_dir = tmp_path / "run"
    code, stdout, stderr = cli("run-all", "--config", config, "--out", run_dir)
    assert code == 2 and stdout == "" and len(stderr.strip().splitlines()) == 1, stderr
    assert str(bad) in stderr and "row 2" in stderr
    assert not run_dir.exists() or not any(run_dir.iterdir())  # so the same command works once fixed


def test_stage_errors_about_a_row_name_the_input_file_not_a_dash():
    e = InputError("advantage is nan", file="-", row=2, column="advantage")
    assert e.located(file="w.parquet").one_line().startswith("w.parquet, row 2, column `advantage`")
    assert InputError("x", file="a.parquet").located(file="b.parquet").file == "a.parquet"
