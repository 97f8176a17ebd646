"""In-process rollout engine vs `transformers serve` (without and with continuous batching), side by side.

The same prompts (one assistant turn of the agent's chat rendering per question), the same token cap, greedy
(temperature 0, so the tokens can be compared; sampling costs the same per token), the same model folder, the
same torch thread count in every process. Each side warms up (the engine with a full pass, a server with one short
request), then `--repeats` timed passes, alternating; the figure is generated tokens per second of wall time
(median), with the served side's tokens counted as the server generated them (`usage.completion_tokens`).
Agreement: for each prompt, whether the served text equals the in-process text (`decode(ids,
skip_special_tokens=True)`), and whether the re-tokenized ids equal the in-process ids.

    python bench/bench_serve.py [--model smollm2] [--questions 4] [--max-new-tokens 16] [--repeats 1] [--threads 1]

Each server is started here on a free port, its model loaded by path (`POST /load_model`, timed apart), and killed
by its process group afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

QUESTIONS = ["Where was the author of the novel Blue Harbour born?", "What is the capital of Skagromia?",
             "When was the university Saba Vrevtou attended established?", "Who founded the Orvell Company?",
             "In which country is the city of Laelrimere?", "What did Bresky Pabro study?",
             "Which river flows through Tamvor?", "Who wrote the play The Last Lantern?"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(threads: int, cb: bool, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads), "TRANSFORMERS_VERBOSITY": "error"}
    argv = [str(Path(sys.executable).with_name("transformers")), "serve", "--host", "127.0.0.1", "--port", str(port),
            "--device", "cpu", *(["--continuous-batching"] if cb else [])]
    proc = subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"transformers serve exited: {log.read_text()[-1500:]}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if json.loads(r.read()).get("status") == "ok":
                    return proc, base
        except OSError:
            time.sleep(0.5)
    stop(proc)
    raise SystemExit("transformers serve did not start in 240 s")


def stop(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(15)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def post(url: str, body: dict, timeout: float = 900) -> bytes:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read()


def served_pass(base: str, model: str, prompts: list[str], max_new: int) -> tuple[float, list[str], int]:
    """All prompts in flight at once (as the rollout sends a batch); seconds, texts, generated tokens."""
    from concurrent.futures import ThreadPoolExecutor

    def one(prompt: str) -> tuple[str, int]:
        obj = json.loads(post(base + "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_new,
                                                          "temperature": 0.0, "seed": 0}))
        return obj["choices"][0]["text"], int(obj["usage"]["completion_tokens"])
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        out = list(pool.map(one, prompts))
    return time.perf_counter() - t0, [t for t, _ in out], sum(n for _, n in out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch

    from atomcli import models
    from atomcli.agent import format as agent_format
    from atomcli.context import Context
    from atomcli.engines.base import GenRequest
    from atomcli.engines.hf import HFEngine
    torch.set_num_threads(args.threads)
    path = models.resolve(args.model, Context(quiet=True).home, print)
    model, tok = models.load(path)
    system = agent_format.system_prompt("2026-01-01", "")
    qs = (QUESTIONS * ((args.questions + len(QUESTIONS) - 1) // len(QUESTIONS)))[:args.questions]
    ids = [tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": q}],
                                   add_generation_prompt=True, tokenize=True, return_dict=False) for q in qs]
    ids = [list(x["input_ids"]) if isinstance(x, dict) else list(x) for x in ids]
    texts = [tok.decode(x, skip_special_tokens=False) for x in ids]  # what a text-only server is sent
    engine = HFEngine(path, model, tok, batch_size=len(ids))

    def local_pass() -> tuple[float, list[list[int]]]:
        reqs = [GenRequest(x, args.max_new_tokens, temperature=0.0, seed=i) for i, x in enumerate(ids)]
        t0 = time.perf_counter()
        res = engine.generate(reqs)
        return time.perf_counter() - t0, [r.ids for r in res]

    _, local_ids = local_pass()  # warm-up
    local_texts = [tok.decode(x, skip_special_tokens=True) for x in local_ids]
    local_tokens = sum(len(x) for x in local_ids)
    result = {"model": args.model, "questions": len(qs), "max_new_tokens": args.max_new_tokens,
              "threads": args.threads, "prompt_tokens_mean": statistics.mean(len(x) for x in ids)}
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "atomcli-bench"
    log_dir.mkdir(parents=True, exist_ok=True)
    for cb in (False, True):
        name = "serve_cb" if cb else "serve"
        proc, base = start_server(args.threads, cb, log_dir / f"{name}.log")
        try:
            t0 = time.perf_counter()
            post(base + "/load_model", {"model": str(path)})
            load_s = time.perf_counter() - t0
            served_pass(base, str(path), texts[:1], 2)  # warm-up: one short request
            local_s, served_s, served_tokens = [], [], 0
            for _ in range(args.repeats):  # alternating
                s, _ = local_pass()
                local_s.append(s)
                s, served_texts, served_tokens = served_pass(base, str(path), texts, args.max_new_tokens)
                served_s.append(s)
        finally:
            stop(proc)
        same_text = sum(a == b for a, b in zip(local_texts, served_texts))
        same_ids = sum(tok(b, add_special_tokens=False)["input_ids"] == [i for i in a if i != tok.eos_token_id]
                       for a, b in zip(local_ids, served_texts))
        local_tps = local_tokens / statistics.median(local_s)
        served_tps = served_tokens / statistics.median(served_s)
        result[name] = {"load_s": round(load_s, 1), "local_tok_s": round(local_tps, 1),
                        "served_tok_s": round(served_tps, 1), "served_over_local": round(served_tps / local_tps, 3),
                        "same_text": f"{same_text}/{len(qs)}", "same_ids": f"{same_ids}/{len(qs)}",
                        "local_tokens": local_tokens, "served_tokens": served_tokens}
        print(json.dumps({name: result[name]}), flush=True)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
