"""Tools cache: a `web_search` served from the cache (hit) against one that goes to the backend (miss).

Both go through `ToolBox.run`, the path a rollout uses, with `--cache FILE`. Backends: the
local FTS5 index over a generated 10k-document corpus, and the same index behind a fixed
delay standing for a web search engine (`--latency`, default 300 ms, about what a DDG query
takes). Each query is looked up once cold (miss: backend call + cache write) and then again
(hit: cache read only), alternating per query so load drifts hit both sides alike.

    .venv/bin/python bench/bench_cache.py [--docs 10000] [--queries 100] [--latency 0.3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_search  # noqa: E402

from atomcli.agent.format import ToolCall  # noqa: E402
from atomcli.context import Context  # noqa: E402
from atomcli.env import search_local  # noqa: E402
from atomcli.env.tools import ToolBox  # noqa: E402
from atomcli import plugins  # noqa: E402


class Delayed:
    """A search backend that answers like `inner` after `latency` seconds (a stand-in for the web)."""

    def __init__(self, inner, latency: float):
        self.inner, self.latency = inner, latency
        self.name = "fake-web"
        self.traits = plugins.SearchTraits("fake-web")

    def read_local(self, url: str):
        return None

    def search(self, query: str, k: int):
        time.sleep(self.latency)
        return self.inner.search(query, k)


def run(tb: ToolBox, queries: list[str]) -> tuple[list[float], list[float]]:
    miss, hit = [], []
    for q in queries:
        for bucket in (miss, hit):
            t0 = time.perf_counter()
            res = tb.run(ToolCall("web_search", {"query": [q]}))
            bucket.append(time.perf_counter() - t0)
            if bucket is hit and not res.cached:
                sys.exit(f"expected a cache hit for {q!r}")
    return miss, hit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=10000)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--latency", type=float, default=0.3, help="seconds the fake web backend takes per query")
    args = ap.parse_args()
    rng = random.Random(0)
    tmp = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    docs = bench_search.make_corpus(tmp / "c.jsonl", args.docs, bench_search.TextGen(rng, "english"))
    search_local.build_index(str(tmp / "c.jsonl"), str(tmp / "i.sqlite"))
    queries = bench_search.make_queries(docs, args.queries, rng)
    ctx = Context(quiet=True)
    print(f"{'backend':>10} {'miss p50 ms':>12} {'hit p50 ms':>11} {'miss/hit':>9}")
    for label, cache in (("local", "local.sqlite"), ("fake-web", "web.sqlite")):
        tb = ToolBox(f"local:{tmp / 'i.sqlite'}", ctx, k=10, cache=str(tmp / cache))
        if label == "fake-web":
            tb.backend = Delayed(tb.backend, args.latency)
            queries_used = queries[: max(5, args.queries // 5)]  # each miss sleeps: keep the run short
        else:
            queries_used = queries
        miss, hit = run(tb, queries_used)
        tb.close()
        m, h = statistics.median(miss) * 1000, statistics.median(hit) * 1000
        print(f"{label:>10} {m:>12.2f} {h:>11.2f} {m / h:>8.1f}x")


if __name__ == "__main__":
    main()
