"""grpo-step: masking, the loss against plain-torch math, optimizer persistence, DDP equivalence."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from conftest import ROOT, atom

from atomcli import checkpoint, models, schema, tableio
from atomcli.context import Context
from atomcli.errors import InputError
from atomcli.stages import grpo_step
from atomcli.train import accel, grpo

THINK = ["<think><PLAN>search for {q}</PLAN></think><tool_call>{{\"name\": \"web_search\", "
         "\"arguments\": {{\"query\": [\"{q}\"]}}}}</tool_call>",
         "<think><OBSERVATION>the page names {a}</OBSERVATION></think><answer>{a}</answer>"]
FACTS = [("founder of Xylo Works", "Ana Berg"), ("capital of Qorvia", "Lunmark"), ("year Pell Bridge opened", "1887"),
         ("author of The Grey Tide", "Ivo Marr"), ("river through Dusk", "the Ilse"), ("coach of the Reds", "Tom Ek")]


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_model)


def trajectory(tok, q, a, *, truncated=False):
    """Token columns the way a rollout builds them: sampled turns (mask 1), inserted tool turns (mask 0)."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt = tok.apply_chat_template([{"role": "system", "content": "Research agent."},
                                      {"role": "user", "content": f"Question: {q}"}],
                                     add_generation_prompt=True, tokenize=False)
    ids, mask = [], []
    for text, sampled in ((THINK[0].format(q=q) + "<|im_end|>", 1),
                          ("\n<|im_start|>tool\n<tool_response>\n1. " + a + " is known for it\n</tool_response>"
                           "<|im_end|>\n<|im_start|>assistant\n", 0),
                          (THINK[1].format(a=a) + "<|im_end|>", 1)):
        piece = enc(text)
        ids += piece
        mask += [sampled] * len(piece)
    if truncated:  # ends in a tool response: masked tokens after the last sampled one
        tail = enc("\n<|im_start|>tool\n<tool_response>\nno results\n</tool_response><|im_end|>\n")
        ids += tail
        mask += [0] * len(tail)
    return enc(prompt), ids, mask


def make_table(tok, n=6, *, seed=0, advantages=None, old=None, tokenizer=None, truncated=(2,)):
    rng = random.Random(seed)
    rows = {k: [] for k in ("group_id", "prompt_ids", "completion_ids", "loss_mask", "old_logprobs",
                            "advantage", "reward")}
    for i in range(n):
        q, a = FACTS[i % len(FACTS)]
        p, c, m = trajectory(tok, q, a, truncated=i in truncated)
        rows["group_id"].append(f"g{i // 3}")
        rows["prompt_ids"].append(p)
        rows["completion_ids"].append(c)
        rows["loss_mask"].append(m)
        rows["old_logprobs"].append(old[i] if old else [round(-rng.uniform(5, 12), 3) if x else 0.0 for x in m])
        rows["advantage"].append(advantages[i] if advantages else rng.uniform(-1.5, 1.5))
        rows["reward"].append(rng.random())
    table = pa.table({k: schema.array(k, v) for k, v in rows.items()})
    return schema.with_provenance(table, "rollout", {"temperature": 1.0}, model="tiny",
                                  tokenizer=tokenizer or models.tokenizer_id(tok))


def with_column(table, name, values):
    return schema.set_columns(table, {name: values})


def plain_logprobs(model, prompt, comp):
    """Log-prob and entropy of every completion token from the full logits (float64)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + comp])).logits[0].double()
    lp = torch.log_softmax(logits, -1)
    pos = torch.arange(len(prompt) - 1, len(prompt) + len(comp) - 1)
    ent = -(lp.exp() * lp).sum(-1)
    return lp[pos, torch.tensor(comp)], ent[pos]


def load(path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def cfg(model, **kw):
    # no activation checkpointing in-process (faster); the CLI and torchrun tests run the default
    base = dict(model=str(model), lr=1e-3, beta=0.0, micro_batch=2, gradient_checkpointing=False)
    return grpo_step.GRPOConfig(**{**base, **kw})


def quiet():
    return Context(quiet=True)


# --- masking ----------------------------------------------------------------------------------------

def test_masked_positions_never_change_the_loss_or_the_update(tiny_model, tmp_path, tok):
    ref = models.make_tiny_model(tmp_path / "ref", seed=1, tokenizer_from=tiny_model)
    table = make_table(tok, truncated=(1, 4))
    c = cfg(tiny_model, beta=0.1, ref=str(ref), epochs=2, entropy_coef=0.01)
    a = grpo_step.run(table, c, quiet())

    masks = table.column("loss_mask").to_pylist()
    rng = random.Random(7)
    old = [[v if m else rng.uniform(-50, 5) for v, m in zip(row, mk)]
           for row, mk in zip(table.column("old_logprobs").to_pylist(), masks)]
    comp = table.column("completion_ids").to_pylist()
    changed = 0
    for i, (ids, mk) in enumerate(zip(comp, masks)):
        last = max(j for j, m in enumerate(mk) if m)
        for j in range(last + 1, len(ids)):
            ids[j] = rng.randrange(3, 40000)
            changed += 1
    assert changed > 10  # the table really has masked tokens after the last sampled one
    edited = with_column(with_column(table, "old_logprobs", old), "completion_ids", comp)
    b = grpo_step.run(edited, c, quiet())

    for key in ("loss", "pg_loss", "kl", "entropy", "grad_norm"):
        assert a.metrics[key] == b.metrics[key], key
    assert a.metrics["last_update"]["loss"] == b.metrics["last_update"]["loss"]
    wa, wb = weights(a.model), weights(b.model)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)

    # control: changing a sampled token's old log-prob does change the loss
    old2 = [list(r) for r in table.column("old_logprobs").to_pylist()]
    j = masks[0].index(1)
    old2[0][j] -= 1.0
    d = grpo_step.run(with_column(table, "old_logprobs", old2), c, quiet())
    assert d.metrics["loss"] != a.metrics["loss"]


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_advantage_sign_moves_the_sampled_tokens_log_prob(tiny_model, tok, sign):
    p, c, m = trajectory(tok, *FACTS[0])
    model = load(tiny_model)
    before, _ = plain_logprobs(model, p, c)
    old = [float(v) if k else 0.0 for v, k in zip(before.tolist(), m)]
    table = make_table(tok, n=1, advantages=[sign], old=[old], truncated=())
    res = grpo_step.run(table, cfg(tiny_model, lr=1e-3), quiet())
    assert res.metrics["ratio"] == pytest.approx(1.0, abs=1e-4)  # old log-probs were the policy's own
    after, _ = plain_logprobs(res.model.eval(), p, c)
    sampled = torch.tensor(m, dtype=torch.bool)
    delta = (after - before)[sampled].sum().item()
    assert sign * delta > 0.05, delta
    # tokens that were never sampled are not pushed up
    assert abs((after - before)[~sampled].mean().item()) < abs(delta) / sampled.sum().item()


def test_recomputed_old_logprobs_stand_in_for_missing_ones(tiny_model, tok):
    """A text-only server's rollout has NaN old log-probs: refused by default, trained with --old-logprobs recompute,
    and the update equals the one from a table holding the policy's own log-probs."""
    model = load(tiny_model)
    table = make_table(tok, n=4, truncated=())
    own = []
    for p, c, m in zip(*(table.column(k).to_pylist() for k in ("prompt_ids", "completion_ids", "loss_mask"))):
        lp, _ = plain_logprobs(model, p, c)
        own.append([float(v) if k else 0.0 for v, k in zip(lp.tolist(), m)])
    nan = [[float("nan")] * len(o) for o in own]
    missing = with_column(table, "old_logprobs", nan)
    with pytest.raises(InputError, match="old log-prob") as e:
        grpo_step.run(missing, cfg(tiny_model), quiet())
    assert "--old-logprobs recompute" in e.value.hint and e.value.row == 0
    recomputed = grpo_step.run(missing, cfg(tiny_model, old_logprobs="recompute"), quiet())
    assert recomputed.metrics["ratio"] == pytest.approx(1.0, abs=1e-6)
    assert recomputed.metrics["clip_low"] == 0 and recomputed.metrics["clip_high"] == 0
    exact = grpo_step.run(with_column(table, "old_logprobs", own), cfg(tiny_model), quiet())
    assert recomputed.metrics["loss"] == pytest.approx(exact.metrics["loss"], rel=1e-4)
    # AdamW's first step is ~lr·sign(g): float noise in near-zero gradients moves a few weights by a
    # fraction of lr. A wrong denominator (e.g. the 0.0 placeholders) would move them by ~lr.
    moved = _max_diff(weights(exact.model), weights(model))
    assert moved > 1e-4  # the step did train
    assert _max_diff(weights(recomputed.model), weights(exact.model)) < 0.05 * moved
    with pytest.raises(InputError, match="old-logprobs source") as e:
        grpo_step.run(table, cfg(tiny_model, old_logprobs="sampler"), quiet())
    assert "recompute" in e.value.hint


# --- the loss against plain torch math --------------------------------------------------------------

@pytest.mark.parametrize("agg", ["token-mean", "seq-mean"])
def test_loss_matches_hand_computation(tiny_model, tmp_path, tok, agg):
    ref_dir = models.make_tiny_model(tmp_path / "ref", seed=3, tokenizer_from=tiny_model)
    policy, ref = load(tiny_model), load(ref_dir)
    table = make_table(tok, n=5, advantages=[1.3, -0.7, 0.4, -1.1, 0.9])
    eps_low, eps_high, beta, ent_coef = 0.2, 0.28, 0.05, 0.01
    rng = random.Random(1)
    rows, olds = [], []
    for p, c, m, a in zip(*(table.column(k).to_pylist() for k in ("prompt_ids", "completion_ids", "loss_mask",
                                                                    "advantage"))):
        lp, ent = plain_logprobs(policy, p, c)
        rlp, _ = plain_logprobs(ref, p, c)
        # old log-probs shifted so that ratios land inside, below and above the clip range
        old = [float(v) + rng.choice([0.0, 0.5, -0.5, 0.1, -0.3]) if k else 0.0 for v, k in zip(lp.tolist(), m)]
        olds.append(old)
        k = torch.tensor(m, dtype=torch.bool)
        rows.append((lp[k], ent[k], rlp[k], torch.tensor(old, dtype=torch.float64)[k], a))
    table = with_column(table, "old_logprobs", olds)

    per_seq, clip_low, clip_high, n_tok = [], 0, 0, 0
    for lp, ent, rlp, old, a in rows:
        r = torch.exp(lp - old.float().double())
        surrogate = torch.min(r * a, r.clamp(1 - eps_low, 1 + eps_high) * a)
        d = rlp - lp
        k3 = torch.exp(d) - d - 1
        per_seq.append(-surrogate + beta * k3 - ent_coef * ent)
        clip_low += int(((r < 1 - eps_low) & (torch.tensor(a) < 0)).sum())
        clip_high += int(((r > 1 + eps_high) & (torch.tensor(a) > 0)).sum())
        n_tok += len(lp)
    if agg == "token-mean":
        expected = torch.cat(per_seq).sum().item() / n_tok
    else:
        expected = sum(x.mean().item() for x in per_seq) / len(per_seq)
    assert clip_low > 0 and clip_high > 0  # both sides of the clip are exercised

    res = grpo_step.run(table, cfg(tiny_model, ref=str(ref_dir), beta=beta, clip_eps=eps_low, clip_eps_high=eps_high,
                                   entropy_coef=ent_coef, loss_agg=agg), quiet())
    assert res.metrics["loss"] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert res.metrics["trained_tokens"] == n_tok
    assert res.metrics["clip_low"] == pytest.approx(clip_low / n_tok)
    assert res.metrics["clip_high"] == pytest.approx(clip_high / n_tok)
    assert res.metrics["kl"] > 0
    # the diagnostics are plain means over the sampled tokens, whatever the loss aggregation
    assert res.metrics["entropy"] == pytest.approx(torch.cat([r[1] for r in rows]).mean().item(), rel=1e-4)
    k3 = torch.cat([torch.exp(r[2] - r[0]) - (r[2] - r[0]) - 1 for r in rows])
    assert res.metrics["kl"] == pytest.approx(k3.mean().item(), rel=1e-3, abs=1e-6)


class CaptureGrads:
    """Stands in for the optimizer: records the gradient the step would apply."""

    def __init__(self, model):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.grads = None

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    def step(self):
        self.grads = [p.grad.clone() for p in self.params]


class FakeWorld:
    """A rank of a 2-process job, run alone: the test sums the ranks' gradients itself."""

    def __init__(self, rank, size):
        self.rank, self.size, self.main = rank, size, rank == 0


def _gradient(tiny_model, table, world, **kw):
    c = grpo_step.loss_settings(cfg(tiny_model, max_grad_norm=0.0, **kw))
    model = load(tiny_model)
    batch = grpo_step.read_batch(table)
    opt = CaptureGrads(model)
    m = grpo.grpo_update(accel.policy_scorer(model), opt, grpo.micro_batches(batch, c, world, torch.device("cpu")), c)
    return opt.grads, m


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean"])
def test_micro_batches_and_ranks_give_the_full_batch_gradient(tiny_model, tok, agg):
    table = make_table(tok, n=5)
    full, m_full = _gradient(tiny_model, table, grpo.World(), micro_batch=100, loss_agg=agg)
    one, m_one = _gradient(tiny_model, table, grpo.World(), micro_batch=1, loss_agg=agg)
    r0, m0 = _gradient(tiny_model, table, FakeWorld(0, 2), micro_batch=2, loss_agg=agg)
    r1, m1 = _gradient(tiny_model, table, FakeWorld(1, 2), micro_batch=2, loss_agg=agg)
    scale = max(g.abs().max().item() for g in full)
    for g_full, g_one, g0, g1 in zip(full, one, r0, r1):
        assert torch.allclose(g_one, g_full, rtol=1e-4, atol=1e-6 * scale)
        assert torch.allclose(g0 + g1, g_full, rtol=1e-4, atol=1e-6 * scale)
    assert m_one["loss"] == pytest.approx(m_full["loss"], rel=1e-6)
    assert m0["loss"] + m1["loss"] == pytest.approx(m_full["loss"], rel=1e-6)
    assert not any(torch.allclose(g0, g_full) for g0, g_full in zip(r0, full) if g_full.abs().max() > 0)


# --- persistence -------------------------------------------------------------------------------------

def _max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_two_calls_continue_one_adamw_run(tiny_model, tmp_path, tok):
    table = make_table(tok, n=4)
    c1 = cfg(tiny_model, beta=0.05)
    first = grpo_step.run(table, c1, quiet())
    checkpoint.save(first, tmp_path / "c1", stage="grpo-step", config=c1)
    state = json.loads((tmp_path / "c1" / "atom_state.json").read_text())
    assert state["step"] == 1 and state["ref"] == str(Path(tiny_model).resolve()) and state["optimizer"]

    c2 = cfg(tmp_path / "c1", beta=0.05)
    second = grpo_step.run(table, c2, quiet())
    assert second.step == 2 and second.ref == state["ref"]
    assert second.metrics["kl"] > 0  # the reference is the starting checkpoint, not c1
    both = grpo_step.run(table, cfg(tiny_model, beta=0.05, epochs=2), quiet())
    chained, in_one = weights(second.model), weights(both.model)
    assert _max_diff(chained, in_one) < 1e-6
    assert second.metrics["loss"] == pytest.approx(both.metrics["last_update"]["loss"], rel=1e-5)

    # control: without optimizer.pt the second step is a different (fresh-AdamW) update
    shutil.copytree(tmp_path / "c1", tmp_path / "c1_noopt")
    (tmp_path / "c1_noopt" / "optimizer.pt").unlink()
    fresh = grpo_step.run(table, cfg(tmp_path / "c1_noopt", beta=0.05), quiet())
    assert _max_diff(weights(fresh.model), in_one) > 100 * max(_max_diff(chained, in_one), 1e-7)


def test_lora_steps_continue_the_adapter_and_save_merged_weights(tiny_model, tmp_path, tok):
    table = make_table(tok, n=3)
    kw = dict(lora=True, lora_r=4, lr=1e-2, beta=0.1)
    first = grpo_step.run(table, cfg(tiny_model, **kw), quiet())
    checkpoint.save(first, tmp_path / "l1", stage="grpo-step", config=None)
    assert (tmp_path / "l1" / "adapter" / "adapter_config.json").is_file()
    merged = load(tmp_path / "l1")  # a plain checkpoint: no peft needed to read it
    base = weights(load(tiny_model))
    assert _max_diff(weights(merged), base) > 1e-4

    second = grpo_step.run(table, cfg(tmp_path / "l1", **kw), quiet())
    assert second.metrics["kl"] > 0  # reference = base with the adapter off
    both = grpo_step.run(table, cfg(tiny_model, epochs=2, **kw), quiet())
    checkpoint.save(second, tmp_path / "l2", stage="grpo-step", config=None)
    checkpoint.save(both, tmp_path / "b2", stage="grpo-step", config=None)
    assert _max_diff(weights(load(tmp_path / "l2")), weights(load(tmp_path / "b2"))) < 1e-6


# --- input checks -------------------------------------------------------------------------------------

def test_temperature_note_says_when_the_ratios_cannot_start_at_one(tiny_model, tok):
    """Rollouts record old_logprobs under the raw logits: an update at another temperature against them starts
    with ratios != 1 (measured here: clipped tokens at step 0), one at 1 or with recomputed old log-probs does not."""
    assert grpo_step.temperature_note(1.0, "rollout") is None
    assert grpo_step.temperature_note(0.7, "recompute") is None
    assert "recompute" in grpo_step.temperature_note(0.7, "rollout")
    table = make_table(tok, n=6)
    model = load(tiny_model)
    with torch.no_grad():  # old_logprobs = the raw policy's own log-probs, as a rollout records them
        old = [plain_logprobs(model, p, c)[0].tolist() for p, c in
               zip(table.column("prompt_ids").to_pylist(), table.column("completion_ids").to_pylist())]
    masks = table.column("loss_mask").to_pylist()
    table = with_column(table, "old_logprobs", [[x if k else 0.0 for x, k in zip(o, m)] for o, m in zip(old, masks)])
    clip = lambda t, old_lp: (lambda r: r.metrics["clip_low"] + r.metrics["clip_high"])(  # noqa: E731
        grpo_step.run(table, cfg(tiny_model, lr=1e-9, temperature=t, old_logprobs=old_lp), quiet()))
    assert clip(1.0, "rollout") == 0 and clip(0.5, "recompute") == 0
    assert clip(0.5, "rollout") > 0


def test_bad_inputs_are_input_errors(tiny_model, tok):
    table = make_table(tok, n=3)
    masks = table.column("loss_mask").to_pylist()
    masks[1] = masks[1][:-1]
    with pytest.raises(InputError, match="loss_mask") as e:
        grpo_step.run(with_column(table, "loss_mask", masks), cfg(tiny_model), quiet())
    assert e.value.row == 1
    with pytest.raises(InputError, match="advantage") as e:
        grpo_step.run(with_column(table, "advantage", [0.1, float("nan"), 0.2]), cfg(tiny_model), quiet())
    assert e.value.row == 1
    with pytest.raises(InputError, match="tokenizer"):
        grpo_step.run(make_table(tok, n=3, tokenizer="OtherTokenizer:100:abc"), cfg(tiny_model), quiet())
    with pytest.raises(InputError, match="no sampled tokens"):
        grpo_step.run(with_column(table, "loss_mask", [[0] * len(m) for m in table.column("loss_mask").to_pylist()]),
                      cfg(tiny_model), quiet())
    with pytest.raises(InputError, match="aggregation"):
        grpo_step.run(table, cfg(tiny_model, loss_agg="sum"), quiet())


def test_cli_grpo_step_writes_checkpoint_and_rejects_nan(tiny_model, tmp_path, tok):
    data = tmp_path / "rewarded.parquet"
    tableio.write_table(make_table(tok, n=3), str(data))
    out = tmp_path / "ckpt"
    proc = atom("grpo-step", data, "--model", tiny_model, "--out", out, "--lr", "1e-3", check=True,
                env={"ATOM_DEBUG": ""})
    assert proc.stdout == b""
    for noise in (b"Warning", b"Loading weights", b"Writing model shards", b"it/s]"):  # atomcli's lines only
        assert noise not in proc.stderr, noise
    for name in ("config.json", "model.safetensors", "tokenizer.json", "optimizer.pt", "atom_state.json",
                 "metrics.json"):
        assert (out / name).is_file(), name
    metrics = json.loads((out / "metrics.json").read_text())
    assert math.isfinite(metrics["loss"]) and metrics["trained_tokens"] > 0 and metrics["reward_std"] > 0

    bad = make_table(tok, n=3)
    bad = with_column(bad, "advantage", [0.1, float("inf"), 0.2])
    tableio.write_table(bad, str(tmp_path / "bad.parquet"))
    proc = atom("grpo-step", tmp_path / "bad.parquet", "--model", tiny_model, "--out", tmp_path / "x")
    assert proc.returncode == 2 and not (tmp_path / "x").exists()
    err = proc.stderr.decode()
    assert "row 1" in err and "advantage" in err and len(err.strip().splitlines()) == 1


# --- distributed ---------------------------------------------------------------------------------------

def test_two_process_launch_matches_one_process(tiny_model, tmp_path, tok):
    data = tmp_path / "rewarded.parquet"
    tableio.write_table(make_table(tok, n=5), str(data))
    flags = ["--lr", "1e-3", "--beta", "0.1", "--micro-batch", "1", "--epochs", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "atomcli", "grpo-step", str(data), "--model", str(tiny_model),
                           "--out", str(tmp_path / "ddp"), *flags],
                          capture_output=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    single = grpo_step.run(tableio.read_table(str(data)),
                           cfg(tiny_model, beta=0.1, micro_batch=1, epochs=2), quiet())
    ddp = json.loads((tmp_path / "ddp" / "metrics.json").read_text())
    assert ddp["world_size"] == 2
    assert ddp["loss"] == pytest.approx(single.metrics["loss"], rel=1e-5)
    assert ddp["grad_norm"] == pytest.approx(single.metrics["grad_norm"], rel=1e-5)
    assert _max_diff(weights(load(tmp_path / "ddp")), weights(single.model)) < 1e-5


# --- zero-advantage rows --------------------------------------------------------------------------

@pytest.mark.parametrize("agg", ["token-mean", "seq-mean"])
def test_skipping_zero_advantage_rows_gives_the_full_update(tiny_model, tmp_path, tok, agg):
    # a zero-variance group (rows 3-5) and one zero inside a live group: 4 of 6 rows skipped
    table = make_table(tok, n=6, advantages=[0.9, 0.0, -0.9, 0.0, 0.0, 0.0])
    full = grpo_step.run(table, cfg(tiny_model, loss_agg=agg, skip_zero_advantage=False, epochs=2), quiet())
    fast = grpo_step.run(table, cfg(tiny_model, loss_agg=agg, epochs=2), quiet())
    assert fast.metrics["skipped_zero_advantage"] == 4 and full.metrics["skipped_zero_advantage"] == 0
    assert fast.metrics["trained_tokens"] < full.metrics["trained_tokens"]
    # the second epoch runs AdamW on moments of the first: equal only if skipped params advanced too
    # float tolerance: other micro-batch shapes reorder the sums (Adam then scales tiny gradients up)
    diff = _max_diff(weights(fast.model), weights(full.model))
    assert diff < 1e-5
    assert fast.metrics["loss"] == pytest.approx(full.metrics["loss"], rel=1e-5, abs=1e-9)
    moved = _max_diff(weights(full.model), weights(load(tiny_model)))
    assert moved > 100 * diff  # the update is not a no-op, so the equality above means something

    # with a KL term the zero rows carry gradient: nothing may be skipped
    kl = grpo_step.run(table, cfg(tiny_model, loss_agg=agg, beta=0.1), quiet())
    assert kl.metrics["skipped_zero_advantage"] == 0
    # no reference with beta = 0: KL not measured; with beta > 0 it is measured (0 here: the reference is
    # the starting checkpoint, and this is its first update)
    assert fast.metrics["kl"] is None and kl.metrics["kl"] == 0.0

    # entropy is measured on the rows forwarded, not diluted by the skipped ones: it equals the
    # entropy of a table holding only the two live rows (the first update's forward is the same model)
    live = table.take([0, 2])
    only_live = grpo_step.run(live, cfg(tiny_model, loss_agg=agg), quiet())
    assert fast.metrics["entropy"] == pytest.approx(only_live.metrics["entropy"], rel=1e-5)
    # the tiny random model is near uniform (entropy ~ log vocab on every row): a mean diluted by the
    # skipped rows' share of the tokens (~2/3 here) would be far below the full pass's
    assert fast.metrics["trained_tokens"] < 0.5 * full.metrics["trained_tokens"]
    assert fast.metrics["entropy"] == pytest.approx(full.metrics["entropy"], rel=0.01)


def test_all_zero_advantages_still_step_adamw_like_the_full_update(tiny_model, tmp_path, tok):
    live = make_table(tok, n=3)
    first = grpo_step.run(live, cfg(tiny_model), quiet())
    checkpoint.save(first, tmp_path / "c1", stage="grpo-step", config=cfg(tiny_model))
    dead = make_table(tok, n=3, advantages=[0.0, 0.0, 0.0])
    full = grpo_step.run(dead, cfg(tmp_path / "c1", skip_zero_advantage=False), quiet())
    fast = grpo_step.run(dead, cfg(tmp_path / "c1"), quiet())
    assert fast.metrics["skipped_zero_advantage"] == 3 and fast.metrics["trained_tokens"] == 0
    # nothing forwarded: entropy and clip fractions are not measurements (null, not 0); the gradient
    # really is 0 (every advantage 0, beta 0), so the loss and grad norm are exact zeros
    for key in ("entropy", "clip_low", "clip_high", "ratio", "kl"):
        assert fast.metrics[key] is None, key
    assert full.metrics["entropy"] > 0 and fast.metrics["grad_norm"] == 0 and fast.metrics["loss"] == 0
    # AdamW's momentum moves the weights even with a zero gradient; the skip must not change that
    assert _max_diff(weights(fast.model), weights(first.model)) > 1e-5
    assert _max_diff(weights(fast.model), weights(full.model)) < 1e-6


def test_cli_grpo_step_that_cannot_fit_stops_before_the_update_and_writes_nothing(tiny_model, tmp_path, tok):
    data = tmp_path / "rewarded.parquet"
    tableio.write_table(make_table(tok, n=3), str(data))
    out = tmp_path / "ckpt"
    proc = atom("grpo-step", data, "--model", tiny_model, "--out", out, env={"ATOM_MEMORY_GB": "0.01"})
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "grpo-step needs about" in err and "--micro-batch" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    # the same update with the check turned off goes through: the refusal came from the estimate, nothing else
    atom("grpo-step", data, "--model", tiny_model, "--out", out, check=True,
         env={"ATOM_MEMORY_GB": "0.01", "ATOM_MEMORY_CHECK": "0"})
    assert (out / "model.safetensors").is_file()
