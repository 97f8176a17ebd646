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


def step_table(run: Path, step: int, rows: list[tuple], turn_adv: list | None = None) -> None:
    """Rows (searches, advantage, finish_reason): the searches are turns 1..n, an answer the turn after."""
    d = run / "steps" / f"{step:04d}"
    d.mkdir(parents=True)
    n_search, adv, finish = zip(*rows)
    cols = {"n_search": list(n_search), "advantage": list(adv), "finish_reason": list(finish),
            "n_turns": [n + (f == "answer") for n, f in zip(n_search, finish)],
            "tool_calls": [[{"turn": t, "name": "web_search"} for t in range(1, n + 1)] for n in n_search]}
    if turn_adv is not None:
        cols["turn_advantages"] = turn_adv
    pq.write_table(pa.table(cols), d / "rewarded.parquet")


def test_decisions_count_search_again_and_answer_choices(tmp_path):
    # step 1: a 2-search answer (+1: one "again", one "answer" -> 0), a 1-search answer (+0.5: one "answer"
    # -> -0.5), a capped 3-search sample (-1.5: two "again", no answer -> -3), and a 0-search answer
    # (no choice after an observation -> 0)
    step_table(tmp_path, 1, [(2, 1.0, "answer"), (1, 0.5, "answer"), (3, -1.5, "max_turns"), (0, 0.0, "answer")])
    # step 2: a capped sample with advantage 0 (masked) pushes nothing
    step_table(tmp_path, 2, [(3, 0.0, "max_turns"), (3, 2.0, "answer")])  # two "again", one "answer" -> +2
    got = load().decisions(tmp_path, range(1, 3))
    assert got == [(1, 1, -1.5, -3.0, -0.5, -3.5), (2, 1, 0.0, 0.0, 2.0, 2.0)]


def test_decisions_use_each_choices_turn_advantage_under_per_turn_credit(tmp_path):
    # 2 searches then an answer, turn advantages [0.1, 0.7, -0.2]: "again" at turn 2 (+0.7), "answer" at
    # turn 3 (-(-0.2)) -> +0.9; a row without turn advantages falls back to its trajectory advantage
    step_table(tmp_path, 1, [(2, 5.0, "answer"), (2, 1.0, "answer")], turn_adv=[[0.1, 0.7, -0.2], None])
    got = load().decisions(tmp_path, range(1, 2))
    assert got[0][0:3] == (1, 0, 0.0) and abs(got[0][5] - 0.9) < 1e-9
