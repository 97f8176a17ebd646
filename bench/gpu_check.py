"""GPU check: rollout and grpo-step throughput, MFU and peak memory in bf16 on one CUDA device.

One CUDA device, under 8 minutes; nothing is downloaded. The policy is a random-init model of
Qwen2.5-1.5B's published shape (`atomcli.scale.QWEN25`, real vocabulary size) built from its
config on the device; the tokenizer is the embedded SmolLM2's (`atomcli.models`), whose ids
all lie inside that vocabulary. Measured, with atomcli's own code paths:

- rollout: `HFEngine.generate` (atomcli/engines/hf.py), G = 16 samples of one prompt, one
  turn of `--max-new-tokens` after a `--prompt-len` prompt; sampled tokens/s, MFU = 2·N·rate,
  peak memory against weights + KV cache (`scale.kv_cache_bytes_per_token`).
- grpo-step: the stage itself, `grpo_step.run` (everything `atom grpo-step` does but reading
  the table and writing the checkpoint: loading the saved policy, accelerate, the
  `--old-logprobs recompute` pass, the updates), gradient checkpointing on, beta 0, on
  G = 16 trajectories of prompt + completion tokens with a masked tool response in each;
  input tokens/s of the updates after the first (which allocates AdamW's moments),
  MFU = 6·N·rate (the recomputed forward of checkpointing is not counted: the hardware does
  ~8·N), the stage's peak memory against `scale.budget` for the same batch. Once per
  `--precision`: bf16 (the GPU default: fp32 weights and AdamW state, bf16 autocast) and fp32.

MFU is given against a bf16 matmul measured in the same process and, for known devices,
against the datasheet's dense bf16 peak. Results go to stdout and, as a Markdown fragment for
bench/RESULTS.md's GPU section, to `--out` (default $OUT/gpu_check.md, else bench/gpu_check.md).

    bash bench/gpu_check.sh               # one CUDA device, under 8 minutes
    bash bench/gpu_check.sh --cpu-smoke   # the same code path, tiny model, CPU, seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from atomcli import scale

NO_DEVICE = 3  # exit status when no CUDA device is visible (bench/gpu_check.sh uses the same)
# dense bf16 tensor-core peaks from the datasheets (no sparsity); first match on the device name wins
DATASHEET_BF16 = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("A100", 312e12))
TINY = scale.Shape("tiny", 64, 2, 4, 2, 160, 0, True)  # vocab filled from the tokenizer
MODES = ("bf16", "fp32")  # grpo-step --precision values, GPU default first
PRECISION_OF = {"bf16": "bf16-autocast", "fp32": "fp32"}  # ... and their accounting in atomcli.scale


@dataclasses.dataclass
class Settings:
    shape: scale.Shape
    device: str
    group_size: int
    prompt_len: int
    completion_len: int
    max_new_tokens: int
    micro_batch: int
    steps: int
    matmul: int


def settings(args) -> Settings:
    if args.cpu_smoke:
        return Settings(TINY, "cpu", 4, 32, 48, 8, 2, 1, 256)
    return Settings(scale.QWEN25[args.shape], "cuda", args.group_size, args.prompt_len, args.completion_len,
                    args.max_new_tokens, args.micro_batch, args.steps, 8192)


def require_cuda() -> None:
    """Fail fast, with what torch sees, when there is no CUDA device."""
    import torch
    if not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda}, "
              f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}). Run it on a GPU "
              "machine, or pass --cpu-smoke to run the same code path on the CPU.", file=sys.stderr)
        sys.exit(NO_DEVICE)


# --- device helpers -------------------------------------------------------------------------------

def sync(device: str) -> None:
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    import torch
    if device == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_bytes(device: str) -> int | None:
    import torch
    return torch.cuda.max_memory_allocated() if device == "cuda" else None


def matmul_peak(device: str, n: int, repeats: int = 10) -> float:
    """Best FLOP/s of an n x n matmul in the compute dtype (bf16 on a GPU, fp32 on the CPU smoke)."""
    import torch
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    a @ b
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def datasheet_peak(name: str) -> float | None:
    return next((v for key, v in DATASHEET_BF16 if key in name), None)


# --- the model ------------------------------------------------------------------------------------

def tokenizer():
    from transformers import AutoTokenizer

    from atomcli import models
    tok = AutoTokenizer.from_pretrained(str(models.ensure_demo_model()))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def build_model(shape: scale.Shape, tok, device: str, dtype):
    """A random-init Qwen2 of `shape` on `device`, in `dtype`, eval mode (as models.load returns it)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                      num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.kv_heads, tie_word_embeddings=shape.tied,
                      max_position_embeddings=32768, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(dtype)
    model.eval()
    return model


# --- rollout ----------------------------------------------------------------------------------------

def rollout(model, tok, st: Settings, n: int, peak: float) -> dict:
    import torch

    from atomcli.engines.base import GenRequest
    from atomcli.engines.hf import HFEngine
    rng = random.Random(0)
    prompt = [rng.randrange(len(tok)) for _ in range(st.prompt_len)]
    engine = HFEngine("gpu-check", model, tok, batch_size=st.group_size, reuse_kv=False)
    # stops=(): a random policy would rarely end a turn itself; every row samples max_new_tokens
    reqs = lambda k, seed: [GenRequest(prompt, k, seed=seed + i, temperature=1.0)
                            for i in range(st.group_size)]
    engine.generate(reqs(4, 10_000))  # warm-up: kernels, allocator
    reset_peak(st.device)
    sync(st.device)
    t0 = time.perf_counter()
    out = engine.generate(reqs(st.max_new_tokens, 0))
    sync(st.device)
    secs = time.perf_counter() - t0
    tokens = sum(len(r.ids) for r in out)
    e = torch.finfo(next(model.parameters()).dtype).bits // 8
    predicted = e * n + st.group_size * (st.prompt_len + st.max_new_tokens) * scale.kv_cache_bytes_per_token(
        st.shape, e)
    return {"tokens": tokens, "seconds": secs, "rate": tokens / secs, "mfu": 2 * n * tokens / secs / peak,
            "peak": peak_bytes(st.device), "predicted": predicted}


# --- grpo-step --------------------------------------------------------------------------------------

def trajectory_table(tok, st: Settings):
    """G trajectories of equal length (no padding), a masked tool response in each completion."""
    import pyarrow as pa
    rng = random.Random(1)
    c = st.completion_len
    rows = {k: [] for k in ("group_id", "prompt_ids", "completion_ids", "loss_mask", "old_logprobs", "advantage")}
    for i in range(st.group_size):
        span = rng.randrange(c // 8, c // 4)
        first = (c - span) // 2
        rows["group_id"].append("g0")
        rows["prompt_ids"].append([rng.randrange(len(tok)) for _ in range(st.prompt_len)])
        rows["completion_ids"].append([rng.randrange(len(tok)) for _ in range(c)])
        rows["loss_mask"].append([1] * first + [0] * span + [1] * (c - span - first))
        rows["old_logprobs"].append([0.0] * c)  # replaced: --old-logprobs recompute
        rows["advantage"].append(rng.gauss(0, 1))
    adv = rows["advantage"]
    m, s = statistics.mean(adv), statistics.pstdev(adv) + 1e-6
    rows["advantage"] = [(a - m) / s for a in adv]
    return pa.table(rows)


def grpo(mode: str, model_dir: str, tok, st: Settings, n: int, peak: float) -> dict:
    """`grpo_step.run` itself (the stage minus reading and writing files) at `--precision mode`."""
    from atomcli.context import Context
    from atomcli.stages import grpo_step
    # epochs: the first update allocates AdamW's moments; the rest are the steady state that is timed.
    # old_logprobs recompute: the ratio starts at 1, as after a real rollout.
    cfg = grpo_step.GRPOConfig(model=model_dir, beta=0.0, micro_batch=st.micro_batch, epochs=1 + st.steps,
                               gradient_checkpointing=True, old_logprobs="recompute", precision=mode)
    reset_peak(st.device)
    result = grpo_step.run(trajectory_table(tok, st), cfg, Context(quiet=True))
    m = result.metrics
    del result
    gc.collect()
    timed = m["updates"][1:]
    secs = statistics.median(u["seconds"] for u in timed)
    rate = statistics.median(u["tokens_per_s"] for u in timed)
    seq = st.prompt_len + st.completion_len - 1  # read_batch drops the last target from the inputs
    predicted = scale.budget(st.shape, scale.SETUPS["1 GPU"], scale.PRECISIONS[PRECISION_OF[mode]], seq=seq,
                             micro_batch=st.micro_batch, checkpointing=True, padded=False).total
    peak_mb = m.get("peak_gpu_mb")
    return {"mode": f"--precision {mode}", "tokens": m["updates"][0]["input_tokens"],
            "trained": m["updates"][0]["trained_tokens"], "seconds": secs, "rate": rate, "mfu": 6 * n * rate / peak,
            "peak": None if peak_mb is None else int(peak_mb * 2 ** 20), "predicted": predicted,
            "loss": m["updates"][0]["loss"], "distributed": m.get("distributed", "?")}


# --- report -------------------------------------------------------------------------------------------

def _gib(x) -> str:
    return "-" if x is None else f"{x / scale.GIB:.1f}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def report(st: Settings, env: dict, roll: dict, steps: list[dict], failures: list[str]) -> str:
    n, sheet = env["n"], env["datasheet"]
    lines = [f"### GPU check (`bench/gpu_check.sh`{' --cpu-smoke' if st.device == 'cpu' else ''}), {env['date']}", "",
             f"Device: {env['device']}; torch {env['torch']} (CUDA {env['cuda']}), transformers {env['transformers']}, "
             f"Python {platform.python_version()}. Model: random-init Qwen2 of the `{st.shape.name}` shape "
             f"(N = {n:,}, vocabulary {st.shape.vocab:,}), SDPA attention. Measured matmul peak "
             f"({st.matmul}², {'bf16' if st.device == 'cuda' else 'fp32'}): {env['peak'] / 1e12:.1f} TFLOP/s"
             + (f"; datasheet dense bf16: {sheet / 1e12:.0f} TFLOP/s." if sheet else "."), "",
             "| stage | precision | work | tokens/s | MFU (measured peak) | MFU (datasheet) | peak GiB | "
             "predicted GiB (atomcli/scale.py) |",
             "|---|---|---|---|---|---|---|---|"]
    if roll:
        lines.append(f"| rollout, HF engine | bf16 | G = {st.group_size} x {st.max_new_tokens} sampled tokens after a "
                     f"{st.prompt_len}-token prompt | {roll['rate']:.0f} | {_pct(roll['mfu'])} | "
                     f"{_pct(roll['mfu'] * env['peak'] / sheet) if sheet else '-'} | {_gib(roll['peak'])} | "
                     f"{_gib(roll['predicted'])} (weights + KV) |")
    for s in steps:
        lines.append(f"| grpo-step update | {s['mode']} | {st.group_size} x {st.prompt_len + st.completion_len} "
                     f"tokens ({s['trained']:,} sampled), micro-batch {st.micro_batch}, checkpointing | "
                     f"{s['rate']:.0f} | {_pct(s['mfu'])} | "
                     f"{_pct(s['mfu'] * env['peak'] / sheet) if sheet else '-'} | {_gib(s['peak'])} | "
                     f"{_gib(s['predicted'])} |")
    lines += ["", "MFU counts 2·N per sampled token (rollout) and 6·N per input token (update; gradient "
              "checkpointing makes the hardware do ~8·N, and attention FLOPs are not counted): lower bounds. "
              "Peak GiB is `torch.cuda.max_memory_allocated`: over the timed generate call (rollout), over the whole "
              "`grpo_step.run` call (update: loading, the old-log-prob pass and every update)."]
    if failures:
        lines += ["", "Failed or skipped: " + "; ".join(failures)]
    return "\n".join(lines) + "\n"


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def default_out(cpu_smoke: bool) -> str:
    """$OUT/gpu_check.md (the device machine's folder that comes back), else bench/gpu_check.md on a GPU;
    a CPU smoke run writes no file unless asked (its numbers are not results)."""
    if os.environ.get("OUT"):
        return str(Path(os.environ["OUT"]) / "gpu_check.md")
    return "" if cpu_smoke else str(ROOT / "bench" / "gpu_check.md")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny model on the CPU: the code path, in seconds")
    ap.add_argument("--shape", default="1.5B", choices=sorted(scale.QWEN25))
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--completion-len", type=int, default=1536)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2, help="timed updates after the first")
    ap.add_argument("--budget-s", type=float, default=400, help="skip the remaining precisions when past this")
    ap.add_argument("--out", default="",
                    help="Markdown fragment (default: $OUT/gpu_check.md, else bench/gpu_check.md; --cpu-smoke: none)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    if not args.cpu_smoke:
        require_cuda()
    import torch
    import transformers
    st = settings(args)
    if args.cpu_smoke:
        torch.set_num_threads(1)
    tok = tokenizer()
    if st.shape.vocab == 0:
        st.shape = dataclasses.replace(st.shape, vocab=len(tok))
    if len(tok) > st.shape.vocab:
        raise SystemExit(f"gpu_check: the tokenizer has {len(tok)} ids, more than the model's {st.shape.vocab}")
    device_name = torch.cuda.get_device_name() if st.device == "cuda" else f"CPU ({platform.processor() or 'cpu'})"
    env = {"device": device_name + (f", {torch.cuda.get_device_properties(0).total_memory / scale.GIB:.0f} GiB"
                                    if st.device == "cuda" else ""),
           "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
           "n": scale.param_count(st.shape), "peak": matmul_peak(st.device, st.matmul),
           "datasheet": datasheet_peak(device_name) if st.device == "cuda" else None,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    failures: list[str] = []
    work = tempfile.TemporaryDirectory(prefix="gpu-check-")
    model_dir = str(Path(work.name) / "policy")
    model = build_model(st.shape, tok, st.device, torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == env["n"], "scale.param_count disagrees with the model"
    model.save_pretrained(model_dir)  # bf16 on disk; grpo-step loads it as fp32 (models.load)
    tok.save_pretrained(model_dir)
    roll: dict = {}
    try:
        roll = rollout(model, tok, st, env["n"], env["peak"])
        print(f"rollout: {roll['rate']:.0f} sampled tokens/s, MFU {_pct(roll['mfu'])}, peak {_gib(roll['peak'])} GiB",
              flush=True)
    except Exception as e:  # the update's numbers are still worth the device time
        failures.append(f"rollout: {_first_line(e)}")
        print(f"rollout failed: {failures[-1]}", file=sys.stderr, flush=True)
        if args.cpu_smoke:
            raise
    del model
    steps = []
    for mode in MODES:
        if time.perf_counter() - t_start > args.budget_s:
            failures.append(f"--precision {mode}: skipped (past --budget-s {args.budget_s:.0f} s)")
            continue
        try:
            steps.append(grpo(mode, model_dir, tok, st, env["n"], env["peak"]))
            s = steps[-1]
            print(f"grpo-step {mode}: {s['rate']:.0f} tokens/s, MFU {_pct(s['mfu'])}, peak {_gib(s['peak'])} GiB "
                  f"(predicted {_gib(s['predicted'])}), loss {s['loss']:.4g}", flush=True)
        except Exception as e:  # one failed precision must not lose the other's numbers on a borrowed machine
            failures.append(f"--precision {mode}: {_first_line(e)}")
            print(f"grpo-step {mode} failed: {failures[-1]}", file=sys.stderr, flush=True)
            if args.cpu_smoke:
                raise
    work.cleanup()
    text = report(st, env, roll, steps, failures)
    print(text)
    out = args.out or default_out(args.cpu_smoke)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
        print(f"written: {out} ({time.perf_counter() - t_start:.0f} s in all)", file=sys.stderr)
    if failures and not (steps or roll):
        sys.exit(1)


if __name__ == "__main__":
    main()
