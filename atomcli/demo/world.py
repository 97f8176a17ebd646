"""`atom demo-world --out DIR --seed S`: writes the embedded demo world, a fictional encyclopedia and
questions that only searching it can answer (`atomcli.demo.generate`), with an SFT set written by a
scripted expert that really uses the tools (`atomcli.demo.expert`). The same seed gives the same bytes
in every file.

DIR receives:
- `corpus.jsonl`: one article per entity {id, title, contents};
- `train.jsonl`, `test.jsonl`: FlashRAG questions {id, question, golden_answers, data_source
  = demo_1hop..demo_4hop}; no question text is in both;
- `index.sqlite`: the corpus indexed by `atom index` (search SPEC `local:DIR/index.sqlite`);
- `sft.parquet`: the expert's trajectories on train questions only, in the atomic-thought agent format,
  for `atom sft`; only trajectories whose answer matches a golden answer become SFT rows.

The style (`STYLES`) picks the expert's way of writing; the world, questions and index are the same:

- `classic` (the default): the expert's plans name the hop count;
- `stepwise`: after each fact the expert rewrites the question with the fact in place;
- `stepwise-real`: the stepwise world plus the train part of the real benchmark `REAL_MIX`: its passages
  join the corpus and index, its train questions follow the demo's in train.jsonl (so run-all's steps
  draw both), and `real_sft`'s expert trajectories over them, searched in this world's own index, are
  shuffled into the SFT set. Its test split is never read: it stays the transfer benchmark. The shared
  index changes the demo questions' results too (the real passages shift BM25's statistics and a few
  rank among them), and the demo expert quotes the sentence that states each fact, as the real-text
  expert does.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from atomcli import __version__
from atomcli.demo import real_docs, real_sft
from atomcli.demo.expert import Expert
from atomcli.demo.expert_kit import SFT_K, SYSTEM_DATE, expert_trajectories
from atomcli.demo.generate import MIN_ARTICLES, generate, render_articles
from atomcli.env import search_local
from atomcli.errors import InputError, unknown_choice

FILES = ("corpus.jsonl", "train.jsonl", "test.jsonl", "index.sqlite", "sft.parquet")
STYLES = ("classic", "stepwise", "stepwise-real")  # the expert's way of writing (module docstring)
REAL_MIX = "sqlite"  # the real benchmark stepwise-real mixes in (atomcli.demo.real_docs)


def _jsonl(rows: list[dict]) -> bytes:
    import orjson
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


def sft_table(rows: list[dict], config: dict):
    """The SFT rows as a trajectory table with contract types and a time-free provenance record."""
    import pyarrow as pa

    from atomcli import schema
    cols = ["id", "question", "golden_answers", "data_source", "traj_id", "group_id", "sample_idx", "policy",
            "messages", "answer", "finish_reason", "format_ok", "n_turns", "n_search", "n_browse", "tool_calls"]
    table = pa.table({c: schema.array(c, [r[c] for r in rows]) for c in cols})
    # schema.with_provenance stamps the wall time; demo-world files must be byte-identical per seed
    rec = {"stage": "demo-world", "version": __version__, "time": None, "config": config}
    return table.replace_schema_metadata({schema.META_KEY: json.dumps({"provenance": [rec]}).encode()})


def check_sizes(articles: int, train: int, test: int, sft: int) -> None:
    if articles < MIN_ARTICLES:
        raise InputError(f"--articles {articles} is too small", hint=f"use at least {MIN_ARTICLES}")
    if min(train, test, sft) < 0 or train + test == 0:
        raise InputError("--train, --test and --sft must be >= 0 and there must be some questions")
    if sft > train:
        raise InputError(f"--sft {sft} exceeds --train {train}", hint="SFT questions come from the train split only")


def main(out: str, *, seed: int = 0, articles: int = 2400, train: int = 400, test: int = 100, sft: int = 200,
         style: str = "classic", snippets: str = search_local.PAGE_ORDER, context=None) -> dict:
    """Write the demo world into the folder `out` (replaced atomically); return a summary.

    `style`: how the expert writes and whether the real benchmark joins in (`STYLES`, module docstring).
    `snippets`: the search results' snippet order the experts see (search_local.SNIPPET_ORDERS); train
    and evaluate on the world with the same `--search-options snippets=...`."""
    from atomcli import tableio
    from atomcli.context import Context

    if style not in STYLES:
        raise unknown_choice("demo-world style", style, STYLES)
    search_local.check_snippet_order(snippets)  # before anything is built
    if snippets != search_local.PAGE_ORDER and style not in ("stepwise", "stepwise-real"):
        raise InputError(f"--snippets {snippets} is for the stepwise styles", hint="use --style stepwise-real")
    ctx = context or Context(quiet=True)
    stepwise = style in ("stepwise", "stepwise-real")
    real = REAL_MIX if style == "stepwise-real" else ""
    check_sizes(articles, train, test, sft)
    dest = Path(out)
    from atomcli import safety
    safety.check_output(dest, safety.DEMO_WORLD)  # never replaces a folder that is not a demo world
    world, train_q, test_q = generate(seed, articles, train, test)
    docs = render_articles(world, seed)
    # the real part (stepwise-real): one corpus and index for both kinds of question, the real train split
    # after the demo's in train.jsonl (run-all's steps draw both), the test split never read
    real_passages, real_train = real_docs.train_part(real)
    config = {"seed": seed, "articles": articles, "train": train, "test": test, "sft": sft, "k": SFT_K,
              "date": SYSTEM_DATE, **({"style": style} if stepwise else {}),  # classic records no style
              **search_local.snippet_options(snippets)}
    with tableio.atomic_dir(dest) as tmp:
        (tmp / "corpus.jsonl").write_bytes(_jsonl(docs + real_passages))
        (tmp / "train.jsonl").write_bytes(_jsonl([q.row() for q in train_q] + real_train))
        (tmp / "test.jsonl").write_bytes(_jsonl([q.row() for q in test_q]))
        index = str(tmp / "index.sqlite")
        search_local.build_index(str(tmp / "corpus.jsonl"), index)
        spec = "local:" + index
        rows, dropped = expert_trajectories(
            spec, ctx, lambda tools: Expert(tools, world, seed, stepwise=stepwise, quote=bool(real)), train_q,
            lambda q: q.golden_answers, limit=sft, snippets=snippets)
        real_rows, real_dropped = [], 0
        if real:  # searched in this world's own index: the observations its rollouts of these questions get
            real_rows, real_dropped = real_sft.trajectories(real, seed=seed, context=ctx, spec=spec, snippets=snippets)
            rows = rows + real_rows
            random.Random(f"stepwise-real-mix:{seed}").shuffle(rows)  # SFT batches see both kinds of question
            config.update(real=real, real_sft=len(real_rows), real_train=len(real_train),
                          real_passages=len(real_passages))
        (tmp / "sft.parquet").write_bytes(tableio.table_bytes(sft_table(rows, config), "parquet"))
    hops = {f"demo_{h}hop": sum(q.data_source == f"demo_{h}hop" for q in train_q + test_q) for h in (1, 2, 3, 4)}
    ctx.log(f"[green]wrote[/] {out}: {len(docs):,} articles, {len(train_q)} train / {len(test_q)} test questions "
            f"({', '.join(f'{k}: {v}' for k, v in hops.items())}), {len(rows) - len(real_rows)} SFT trajectories"
            + (f" ({dropped} expert failures dropped)" if dropped else "")
            + (f"; + {len(real_passages):,} real ({real}) passages, {len(real_train)} real train questions, "
               f"{len(real_rows)} real-text SFT trajectories ({real_dropped} dropped)" if real else ""))
    return {"articles": len(docs), "train": len(train_q), "test": len(test_q), "sft": len(rows),
            "dropped": dropped + real_dropped, "hops": hops,
            **({"sft_real": len(real_rows), "real_train": len(real_train), "real_passages": len(real_passages)}
               if real else {})}
