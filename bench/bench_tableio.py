"""Table I/O overhead: reading and writing a stage's table against the stage's own work.

A synthetic rollout table of realistic shape (system + user + 6 assistant turns, each but the
last followed by a tool response of ~1.2k characters; ~300 prompt ids and ~1500 completion ids
with their loss mask and log-probs) goes through `score-rrm --judge heuristic` and then
`aggregate-reward`, the way `cli.py` runs them: `tableio.read_table` (which also conforms the
columns to the contract), the stage's `run`, `tableio.write_stage` (Parquet, zstd, atomic).
Token ids are uniform random, which compresses worse than real text: an upper bound on I/O.

At the small size everything is timed. At the big size (a subprocess per size, so peak RSS is
that size's alone) the I/O side is timed and the stages are timed only with `--stage-at-big`;
otherwise their time is extrapolated linearly from the small size (both stages are one pass
over the rows) and marked `extrap`.

    .venv/bin/python bench/bench_tableio.py                      # 1k, then 100k I/O
    .venv/bin/python bench/bench_tableio.py --sizes 1000 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STAGES = ("score-rrm", "aggregate-reward")
UNIQUE = 1000  # distinct message lists; larger tables repeat them (token columns are all fresh)


def _words(rng: random.Random, n: int) -> str:
    vocab = ["paris", "born", "museum", "river", "city", "year", "founded", "painter", "novel", "search",
             "result", "the", "of", "in", "and", "was", "a", "which", "observatory", "capital"]
    return " ".join(rng.choice(vocab) for _ in range(n))


def _messages(rng: random.Random, question: str) -> list[dict]:
    from atomcli import agent_format
    msgs = [{"role": "system", "content": agent_format.system_prompt("2026-01-01")},
            {"role": "user", "content": agent_format.user_message(question)}]
    for turn in range(6):
        think = (f"<think><OBSERVATION>{_words(rng, 25)}</OBSERVATION> <PLAN>{_words(rng, 20)}</PLAN> "
                 f"<REFLECTION>{_words(rng, 15)}</REFLECTION></think>")
        if turn < 5:
            q = json.dumps({"name": "web_search", "arguments": {"query": [_words(rng, 4), _words(rng, 3)]}})
            msgs.append({"role": "assistant", "content": f"{think}\n<tool_call>{q}</tool_call>"})
            msgs.append({"role": "tool", "content": agent_format.tool_message(_words(rng, 200))})
        else:
            msgs.append({"role": "assistant", "content": f"{think}\n<answer>paris</answer>"})
    return msgs


def _lists(values, lengths, type_):
    import numpy as np
    import pyarrow as pa
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=type_))


def make_table(n: int, seed: int = 0):
    """A rollout table with n trajectories (groups of 8)."""
    import numpy as np
    import pyarrow as pa

    from atomcli import schema
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    base_msgs = [_messages(rng, f"Where was person {i} born?") for i in range(min(n, UNIQUE))]
    idx = pa.array(np.arange(n) % len(base_msgs))
    msgs = pa.array(base_msgs, type=schema.COLUMNS["messages"].type).take(idx)
    p_len = nrng.integers(250, 350, n)
    c_len = nrng.integers(1300, 1700, n)
    cols = {
        "id": [f"q{i // 8}" for i in range(n)],
        "question": [f"Where was person {i // 8} born?" for i in range(n)],
        "golden_answers": [["Paris", "paris, france"]] * n,
        "traj_id": [f"q{i // 8}/{i % 8}" for i in range(n)],
        "group_id": [f"q{i // 8}" for i in range(n)],
        "sample_idx": [i % 8 for i in range(n)],
        "answer": [rng.choice(["paris", "rome", "Paris France", None]) for _ in range(n)],
        "finish_reason": ["answer"] * n,
        "format_ok": [rng.random() < 0.9 for _ in range(n)],
        "n_turns": [6] * n,
    }
    arrays = {k: schema.array(k, v) for k, v in cols.items()}
    arrays["messages"] = msgs
    total_c = int(c_len.sum())
    arrays["prompt_ids"] = _lists(nrng.integers(0, 49152, int(p_len.sum()), dtype=np.int32), p_len, pa.int32())
    arrays["completion_ids"] = _lists(nrng.integers(0, 49152, total_c, dtype=np.int32), c_len, pa.int32())
    arrays["loss_mask"] = _lists((nrng.random(total_c) < 0.3).astype(np.int8), c_len, pa.int8())
    arrays["old_logprobs"] = _lists(-nrng.random(total_c, dtype=np.float32), c_len, pa.float32())
    table = pa.table(arrays)
    return schema.with_provenance(table, "rollout", tokenizer="bench")


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(n: int, repeats: int, run_stages: bool) -> dict:
    """One size, in this process: {stage: {read, write, run}} medians in seconds, + sizes."""
    from atomcli import aggregate_reward, score_rrm, tableio
    from atomcli.context import Context
    ctx = Context(quiet=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-tableio-"))
    t0 = time.perf_counter()
    tableio.write_table(make_table(n), str(tmp / "rollout.parquet"))
    gen = time.perf_counter() - t0
    configs = {"score-rrm": (score_rrm, score_rrm.ScoreConfig(judge="heuristic"), "rollout.parquet",
                             "scored.parquet"),
               "aggregate-reward": (aggregate_reward, aggregate_reward.AggregateConfig(), "scored.parquet",
                                    "rewarded.parquet")}
    out: dict = {"n": n, "generate_s": gen}
    for name in STAGES:
        mod, cfg, src, dst = configs[name]
        times = {"read": [], "run": [], "write": []}
        for r in range(repeats):
            t0 = time.perf_counter()
            table = tableio.read_table(str(tmp / src))
            t1 = time.perf_counter()
            if run_stages:
                result = mod.run(table, cfg, ctx)
                t2 = time.perf_counter()
                times["run"].append(t2 - t1)
            else:  # big size without stages: write the input back out, same shape +/- a few columns
                result, t2 = table, time.perf_counter()
            tableio.write_stage(result, str(tmp / dst), name, cfg, inherit=table)
            times["write"].append(time.perf_counter() - t2)
            times["read"].append(t1 - t0)
            del table, result
        out[name] = {k: statistics.median(v) if v else None for k, v in times.items()}
        out[name]["file_mb"] = (tmp / dst).stat().st_size / 2**20
    out["peak_rss_mb"] = rss_mb()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,100000", help="first size: stages timed; later ones: I/O only")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--big-repeats", type=int, default=1)
    ap.add_argument("--stage-at-big", action="store_true", help="also time the stages at the bigger sizes")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--stages", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.repeats, args.stages)))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    res = []
    for i, n in enumerate(sizes):
        stages = i == 0 or args.stage_at_big
        repeats = args.repeats if i == 0 else args.big_repeats
        cmd = [sys.executable, __file__, "--one", str(n), "--repeats", str(repeats)]
        proc = subprocess.run(cmd + (["--stages"] if stages else []), capture_output=True, text=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if proc.returncode:
            sys.exit(f"size {n} failed:\n{proc.stderr[-3000:]}")
        res.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"size {n}: table generated in {res[-1]['generate_s']:.1f} s, peak RSS {res[-1]['peak_rss_mb']:.0f} MB",
              file=sys.stderr, flush=True)
    small = res[0]
    print(f"{'rows':>7} {'stage':>17} {'read s':>8} {'write s':>8} {'stage s':>9} {'I/O / stage':>12} "
          f"{'file MB':>8} {'peak RSS MB':>12}")
    for r in res:
        for name in STAGES:
            s = r[name]
            run, note = s["run"], ""
            if run is None:  # linear in rows: both stages are one pass over the table
                run, note = small[name]["run"] * r["n"] / small["n"], " extrap"
            io = s["read"] + s["write"]
            print(f"{r['n']:>7} {name:>17} {s['read']:>8.3f} {s['write']:>8.3f} {run:>9.3f}{note:7s} "
                  f"{100 * io / run:>10.1f}% {s['file_mb']:>8.1f} {r['peak_rss_mb']:>12.0f}")


if __name__ == "__main__":
    main()
