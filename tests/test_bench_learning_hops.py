"""bench/learning_hops.py --decisions: the advantage on each "search again or answer" choice, per step."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "learning_hops.py"


def load():
    spec = importlib.util.spec_from_file_location("learning_hops", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def step_table(run: Path, step: int, rows: list[tuple]) -> None:
    d = run / "steps" / f"{step:04d}"
    d.mkdir(parents=True)
    n_search, adv, finish = zip(*rows)
    pq.write_table(pa.table({"n_search": list(n_search), "advantage": list(adv), "finish_reason": list(finish)}),
                   d / "rewarded.parquet")


def test_decisions_count_search_again_and_answer_choices(tmp_path):
    # step 1: a 2-search answer (+1: one "again", one "answer" -> 0), a 1-search answer (+0.5: one "answer"
    # -> -0.5), a capped 3-search sample (-1.5: two "again", no answer -> -3), and a 0-search answer
    # (no choice after an observation -> 0)
    step_table(tmp_path, 1, [(2, 1.0, "answer"), (1, 0.5, "answer"), (3, -1.5, "max_turns"), (0, 0.0, "answer")])
    # step 2: a capped sample with advantage 0 (masked) pushes nothing
    step_table(tmp_path, 2, [(3, 0.0, "max_turns"), (3, 2.0, "answer")])  # two "again", one "answer" -> +2
    got = load().decisions(tmp_path, range(1, 3))
    assert got == [(1, 1, -1.5, -3.0, -0.5, -3.5), (2, 1, 0.0, 0.0, 2.0, 2.0)]
