"""bench/real_docs/rft.py: keep the right, well-formed, answered trajectories, a bounded number a question."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "real_docs" / "rft.py"


def rows():
    def r(qid, sample, answer, gold="OFF", ok=True, finish="answer", source="sqlite_1hop"):
        return {"id": qid, "traj_id": f"{qid}/{sample}", "golden_answers": [gold], "answer": answer,
                "format_ok": ok, "finish_reason": finish, "data_source": source, "prompt_ids": [1, 2, sample]}
    return [
        r("q1", 0, "ON"),                       # wrong
        r("q1", 1, "off"),                      # right (normalized like the scorer): kept
        r("q1", 2, "OFF"),                      # right, but q1 already has one
        r("q2", 0, "OFF", ok=False),            # right words, ill-formed
        r("q2", 1, "OFF", finish="max_turns"),  # not an answer the policy gave
        r("q3", 0, "version 3.32.0", gold="3.32.0", source="sqlite_2hop"),  # F1 0.67: below the default 1.0
        r("q4", 0, None),                       # no answer
    ]


def run(tmp_path, *extra):
    src, out = tmp_path / "roll.parquet", tmp_path / "sft.parquet"
    pq.write_table(pa.Table.from_pylist(rows()), src)
    proc = subprocess.run([sys.executable, str(SCRIPT), str(src), str(out), *extra], capture_output=True, text=True)
    return proc, out


def test_keeps_one_right_answer_a_question_with_its_token_columns(tmp_path):
    proc, out = run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    kept = pq.read_table(out).to_pylist()
    assert [r["traj_id"] for r in kept] == ["q1/1"]
    assert kept[0]["prompt_ids"] == [1, 2, 1]
    assert "kept 1 on 1 questions" in proc.stderr


def test_thresholds_and_per_question_bound_are_options(tmp_path):
    proc, out = run(tmp_path, "--min-f1", "0.5", "--per-question", "2")
    assert proc.returncode == 0, proc.stderr
    assert [r["traj_id"] for r in pq.read_table(out).to_pylist()] == ["q1/1", "q1/2", "q3/0"]


def test_nothing_right_writes_nothing(tmp_path):
    proc, out = run(tmp_path, "--min-f1", "1.1")
    assert proc.returncode != 0 and "nothing to write" in proc.stderr
    assert not out.exists()
