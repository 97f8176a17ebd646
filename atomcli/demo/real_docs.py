"""Real-text benchmarks shipped with atomcli: `atom demo-world --real NAME --out DIR`.

This module owns the packaged benchmark data under `atomcli/data/<name>_docs/`, reading it
(`load`), checking every question against its passages (`verify`), and writing a benchmark
folder (`build`) in the demo world's layout, so that every command that takes a demo-world
folder takes this one too:

- `corpus.jsonl`: passages {id, title, contents} (no url: search results get local urls
  that browse_webpage reads back from the index);
- `train.jsonl`, `test.jsonl`: FlashRAG questions {id, question, golden_answers,
  data_source} plus `hops` (1 or 2); the split is stored with each question, so it never
  changes between builds;
- `index.sqlite`: the corpus indexed by `search_local.build_index` (what `atom index` runs).

Benchmarks (NAMES):
- `sqlite`: SQLite's documentation from Debian's `sqlite3-doc` package (public domain):
  C API pages, SQL language pages, pragmas, limits, compile-time options, result codes, the
  file format and other topic pages, cut into ~100-200-word passages by
  `scripts/build_sqlite.py`; hand-written short-answer questions, 1-hop (the answer
  is in one passage) and 2-hop (one passage names the entity, another holds the fact): 139 split
  60/40 by a fixed rule (55 test), then a training-only supplement of 400 (`sqlite_140`-`sqlite_599`)
  and a test-only supplement of 60 (`sqlite_600` on) on pages no training question uses: 484 train,
  115 test.

Question rules that `verify` enforces: every support id is a passage; every golden answer
occurs (case-insensitively, digit-group commas ignored) in one of the question's support
passages (title or contents); no golden answer occurs in the question text; ids are unique and splits are train/test.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
from pathlib import Path

from atomcli.errors import unknown_choice

NAMES = ("sqlite",)
_PACKAGE_DIR = {"sqlite": "sqlite_docs"}
SPLITS = ("train", "test")
FLASHRAG_FIELDS = ("id", "question", "golden_answers", "data_source")


def _data(name: str):
    if name not in NAMES:
        raise unknown_choice("real benchmark", name, NAMES)
    return importlib.resources.files("atomcli") / "data" / _PACKAGE_DIR[name]


def load(name: str) -> tuple[list[dict], list[dict]]:
    """The packaged passages and questions of benchmark `name`."""
    data = _data(name)
    corpus = [json.loads(line) for line in gzip.decompress((data / "corpus.jsonl.gz").read_bytes()).splitlines()
              if line.strip()]
    questions = [json.loads(line) for line in (data / "questions.jsonl").read_text(encoding="utf-8").splitlines()
                 if line.strip()]
    return corpus, questions


def occurs(answer: str, text: str) -> bool:
    """Case-insensitive substring test that ignores digit-group commas ("1,000" = "1000")."""
    a, t = answer.lower(), text.lower()
    return a in t or a.replace(",", "") in t.replace(",", "")


def verify(questions: list[dict], corpus: list[dict]) -> list[str]:
    """Every broken rule, one line each (empty when all questions are sound)."""
    docs = {d["id"]: d.get("title", "") + "\n" + d.get("contents", "") for d in corpus}
    problems, seen = [], set()
    for q in questions:
        qid = q.get("id")
        if qid in seen:
            problems.append(f"{qid}: duplicate id")
        seen.add(qid)
        golds = q.get("golden_answers") or []
        support = q.get("support") or []
        if not golds:
            problems.append(f"{qid}: no golden answers")
        if q.get("hops") not in (1, 2):
            problems.append(f"{qid}: hops must be 1 or 2")
        elif len(support) < q["hops"]:
            problems.append(f"{qid}: {q['hops']}-hop question with {len(support)} support passage(s)")
        if q.get("split") not in SPLITS:
            problems.append(f"{qid}: split must be train or test")
        missing = [s for s in support if s not in docs]
        if missing:
            problems.append(f"{qid}: unknown support passage(s) {missing}")
        text = q.get("question", "")
        for g in golds:
            if occurs(g, text):
                problems.append(f"{qid}: golden answer {g!r} occurs in the question")
            if not any(occurs(g, docs[s]) for s in support if s in docs):
                problems.append(f"{qid}: golden answer {g!r} is in none of its support passages")
    return problems


def train_part(name: str) -> tuple[list[dict], list[dict]]:
    """The passages of benchmark `name` and its train split as FlashRAG rows (never its test split):
    what a demo world that mixes real text adds to its corpus and train.jsonl ("" = nothing)."""
    if not name:
        return [], []
    corpus, questions = load(name)
    return corpus, [{k: q[k] for k in FLASHRAG_FIELDS} for q in questions if q["split"] == "train"]


def flashrag_row(q: dict) -> dict:
    row = {k: q[k] for k in FLASHRAG_FIELDS}
    row["hops"] = q["hops"]
    return row


def _jsonl(rows: list[dict]) -> bytes:
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in rows)


def build(name: str, out_dir: Path, *, context=None) -> dict:
    """Write benchmark `name` into the folder `out_dir` (replaced atomically); return a summary."""
    from atomcli import tableio
    from atomcli.env import search_local

    corpus, questions = load(name)  # raises the usage error for an unknown name first
    dest = Path(out_dir)
    from atomcli import safety
    safety.check_output(dest, safety.DEMO_WORLD)  # never replaces a folder that is not a demo world
    problems = verify(questions, corpus)
    if problems:  # packaged data, not user input: a broken package is a runtime failure
        raise RuntimeError(f"the packaged `{name}` benchmark fails verification: {problems[0]}"
                           + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    split = {s: [flashrag_row(q) for q in questions if q["split"] == s] for s in SPLITS}
    with tableio.atomic_dir(dest) as tmp:
        (tmp / "corpus.jsonl").write_bytes(_jsonl(corpus))
        for s in SPLITS:
            (tmp / f"{s}.jsonl").write_bytes(_jsonl(split[s]))
        search_local.build_index(str(tmp / "corpus.jsonl"), str(tmp / "index.sqlite"))
    hops = {f"{s}_{h}hop": sum(r["hops"] == h for r in split[s]) for s in SPLITS for h in (1, 2)}
    if context is not None:
        context.log(f"[green]wrote[/] {out_dir}: real benchmark `{name}`, {len(corpus):,} passages, "
                    f"{len(split['train'])} train / {len(split['test'])} test questions "
                    f"({', '.join(f'{k}: {v}' for k, v in hops.items())}); "
                    f"search it with --search local:{Path(out_dir) / 'index.sqlite'}")
    return {"name": name, "passages": len(corpus), "train": len(split["train"]), "test": len(split["test"]),
            "hops": hops, "index": str(Path(out_dir) / "index.sqlite")}
