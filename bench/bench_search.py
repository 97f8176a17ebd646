"""Benchmark the local search engine: index build time and query latency at 10k and 100k documents.

Two generated corpora of ~50-word documents (40-60 words) per size:
- `english`: a stand-in for encyclopedia text. 45% of tokens are English function words (Zipf
  over the engine's stopword list, as in real prose), the rest content words drawn Zipf-like
  from a synthetic 50k-word vocabulary.
- `flat`: no function words; every token comes from a steep Zipf over a 30k vocabulary, so the
  most frequent *content* words occur in up to half the documents. This is the worst case for
  an OR query (FTS5 scores every document that matches any term) and bounds the latency from above.
Queries are 2-6 words taken from random documents behind a question word, the shape of what an
agent writes. Build time is JSONL on disk -> index file, all of what `atom index` does.
Two FTS5 indexes are built per corpus: the default (`fts5+i`, with precomputed BM25 impacts)
and `--no-impacts` (`fts5`, ranked by FTS5's bm25()); their queries alternate one by one.
When `bm25s` is installed the same corpus and queries run through it too, with ratios against
the default engine; when it is not, that side is skipped with a note.

    .venv/bin/python bench/bench_search.py [--sizes 10000,100000] [--queries 300] [--k 10]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

from atomcli.env import search_local


class TextGen:
    """Seeded Zipf-like word streams (cum_weights precomputed: choices() is O(log V) then)."""

    def __init__(self, rng: random.Random, kind: str):
        self.rng, self.kind = rng, kind
        size, offset = (50000, 50) if kind == "english" else (30000, 10)
        vocab = sorted({"".join(rng.choice("bcdfghklmnprstvz") + rng.choice("aeiou") for _ in range(rng.randint(2, 4)))
                        for _ in range(size)})
        rng.shuffle(vocab)
        self.vocab, self.cum = vocab, list(itertools.accumulate(1 / (r + offset) for r in range(len(vocab))))
        self.func = sorted(search_local.STOPWORDS)
        rng.shuffle(self.func)
        self.func_cum = list(itertools.accumulate(1 / (r + 1) for r in range(len(self.func))))

    def words(self, n: int) -> list[str]:
        content = self.rng.choices(self.vocab, cum_weights=self.cum, k=n)
        if self.kind != "english":
            return content
        func = self.rng.choices(self.func, cum_weights=self.func_cum, k=n)
        return [f if self.rng.random() < 0.45 else c for f, c in zip(func, content)]


def make_corpus(path: Path, n: int, gen: TextGen) -> list[list[str]]:
    docs = []
    with open(path, "wb") as f:
        for i in range(n):
            words = gen.words(gen.rng.randint(40, 60))
            docs.append(words)
            f.write(orjson.dumps({"id": f"d{i}", "title": " ".join(words[:3]).title(),
                                  "contents": " ".join(words)}) + b"\n")
    return docs


def make_queries(docs: list[list[str]], m: int, rng: random.Random) -> list[str]:
    lead = ["who", "what is", "when was", "where is the", ""]
    return [f"{rng.choice(lead)} {' '.join(rng.sample(d, rng.randint(2, 6)))}".strip()
            for d in rng.sample(docs, min(m, len(docs)))]


def time_queries(fn, queries: list[str]) -> list[float]:
    fn(queries[0])  # warm caches once, as a running rollout would be
    out = []
    for q in queries:
        t0 = time.perf_counter()
        fn(q)
        out.append(time.perf_counter() - t0)
    return out


def bench_bm25s(docs: list[list[str]], queries: list[str], k: int) -> tuple[float, list[float]]:
    import bm25s
    t0 = time.perf_counter()
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([" ".join(d) for d in docs], show_progress=False), show_progress=False)
    build = time.perf_counter() - t0
    lat = time_queries(lambda q: retriever.retrieve(bm25s.tokenize([q], show_progress=False), k=k,
                                                    show_progress=False), queries)
    return build, lat


def ms(xs: list[float], q: float = 0.5) -> float:
    return 1000 * (statistics.median(xs) if q == 0.5 else sorted(xs)[min(len(xs) - 1, int(q * len(xs)))])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--kinds", default="english,flat")
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    have_bm25s = importlib.util.find_spec("bm25s") is not None
    if not have_bm25s:
        print("bm25s is not installed: FTS5 only (pip install bm25s to compare)", file=sys.stderr)
    print(f"{'docs':>8} {'corpus':>8} {'engine':>6} {'build s':>8} {'query p50 ms':>13} {'p95 ms':>7} {'index MB':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for n, kind in itertools.product((int(s) for s in args.sizes.split(",")), args.kinds.split(",")):
            rng = random.Random(args.seed)
            corpus, index = Path(tmp) / f"c{n}{kind}.jsonl", Path(tmp) / f"i{n}{kind}.sqlite"
            docs = make_corpus(corpus, n, TextGen(rng, kind))
            queries = make_queries(docs, args.queries, rng)
            plain = Path(tmp) / f"p{n}{kind}.sqlite"
            t0 = time.perf_counter()
            search_local.build_index(str(corpus), str(plain), impacts=False)
            build_plain = time.perf_counter() - t0
            t0 = time.perf_counter()
            search_local.build_index(str(corpus), str(index))
            build = time.perf_counter() - t0
            ix, ix_plain = search_local.open_index(str(index)), search_local.open_index(str(plain))
            # alternate the two paths query by query, so that load changes hit both alike
            lat, lat_plain = [], []
            for q in queries[:1] + queries:
                for engine, out in ((ix, lat), (ix_plain, lat_plain)):
                    t0 = time.perf_counter()
                    engine.search(q, args.k)
                    out.append(time.perf_counter() - t0)
            lat, lat_plain = lat[1:], lat_plain[1:]
            ix.close(), ix_plain.close()
            print(f"{n:>8} {kind:>8} {'fts5+i':>6} {build:>8.2f} {ms(lat):>13.2f} {ms(lat, .95):>7.2f} "
                  f"{index.stat().st_size / 2**20:>9.1f}", flush=True)
            print(f"{n:>8} {kind:>8} {'fts5':>6} {build_plain:>8.2f} {ms(lat_plain):>13.2f} {ms(lat_plain, .95):>7.2f} "
                  f"{plain.stat().st_size / 2**20:>9.1f}", flush=True)
            print(f"{'':>8} {'':>8} ratio impacts/bm25(): build {build / build_plain:.2f}x, "
                  f"query p50 {statistics.median(lat) / statistics.median(lat_plain):.2f}x", flush=True)
            if have_bm25s:
                b_build, b_lat = bench_bm25s(docs, queries, args.k)
                print(f"{n:>8} {kind:>8} {'bm25s':>6} {b_build:>8.2f} {ms(b_lat):>13.2f} {ms(b_lat, .95):>7.2f} {'-':>9}")
                print(f"{'':>8} {'':>8} ratio fts5+i/bm25s: build {build / b_build:.2f}x, "
                      f"query p50 {statistics.median(lat) / statistics.median(b_lat):.2f}x", flush=True)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB "
          "(includes the generated corpora kept for the query sampler)", file=sys.stderr)


if __name__ == "__main__":
    main()
