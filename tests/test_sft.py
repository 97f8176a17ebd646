"""sft: assistant-only masks, token columns vs chat rendering, reward filter, a real TRL run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pytest
import torch
from conftest import ROOT, atom

from atomcli import models, schema, tableio
from atomcli.context import Context
from atomcli.errors import InputError
from atomcli.stages import sft

FACTS = [("who founded Xylo Works", "Ana Berg"), ("where is Qorvia's capital", "Lunmark"),
         ("when did Pell Bridge open", "1887"), ("who wrote The Grey Tide", "Ivo Marr")]


def messages(q, a):
    return [{"role": "system", "content": "You are a research agent."},
            {"role": "user", "content": f"Question: {q}"},
            {"role": "assistant", "content": f"<think><PLAN>search {q}</PLAN></think><tool_call>{{\"name\": "
                                             f"\"web_search\", \"arguments\": {{\"query\": [\"{q}\"]}}}}</tool_call>"},
            {"role": "tool", "content": f"<tool_response>\n1. TOOLTEXT {a} is the one\n</tool_response>"},
            {"role": "assistant", "content": f"<think><OBSERVATION>the page says {a}</OBSERVATION></think>"
                                             f"<answer>{a}</answer>"}]


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_model)


def test_chat_rendering_masks_everything_but_assistant_output(tok):
    msgs = messages(*FACTS[0])
    ids, mask = sft.render_masked(msgs, tok)
    assert len(ids) == len(mask)
    assert tok.decode(ids) == tok.apply_chat_template(msgs, tokenize=False)  # the same text the model reads
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert trained == "".join(m["content"] + "<|im_end|>" for m in msgs if m["role"] == "assistant")
    context = tok.decode([i for i, m in zip(ids, mask) if not m])
    for m in msgs:
        if m["role"] != "assistant":
            assert m["content"] in context
    assert "TOOLTEXT" not in trained and "research agent" not in trained


def test_token_columns_are_used_when_they_match_the_tokenizer(tok):
    msgs = [messages(*f) for f in FACTS[:2]]
    prompt = [[1, 2, 3], [4, 5]]
    comp = [[10, 11, 12, 13], [14, 15, 16]]
    mask = [[1, 1, 0, 1], [0, 1, 1]]
    table = pa.table({"messages": schema.array("messages", msgs), "prompt_ids": schema.array("prompt_ids", prompt),
                      "completion_ids": schema.array("completion_ids", comp),
                      "loss_mask": schema.array("loss_mask", mask)})
    matching = schema.with_provenance(table, "rollout", tokenizer=models.tokenizer_id(tok))
    ex, how = sft.build_examples(matching, tok)
    assert how == "token columns"
    assert ex["input_ids"] == [[1, 2, 3, 10, 11, 12, 13], [4, 5, 14, 15, 16]]
    assert ex["completion_mask"] == [[0, 0, 0, 1, 1, 0, 1], [0, 0, 0, 1, 1]]
    other = schema.with_provenance(table, "rollout", tokenizer="Other:1:x")
    ex, how = sft.build_examples(other, tok)
    assert how == "chat template" and ex["input_ids"][0] == sft.render_masked(msgs[0], tok)[0]


def test_rows_without_tokens_in_a_token_table_are_rendered_and_half_filled_rows_are_refused(tok):
    # run-all's rounds mix the expert's rows (messages only) into the policy's kept rows (token columns)
    msgs = [messages(*f) for f in FACTS[:3]]
    table = pa.table({"messages": schema.array("messages", msgs),
                      "prompt_ids": schema.array("prompt_ids", [[1, 2], None, [3]]),
                      "completion_ids": schema.array("completion_ids", [[10, 11], None, [12]]),
                      "loss_mask": schema.array("loss_mask", [[1, 0], None, [1]])})
    mixed = schema.with_provenance(table, "rollout", tokenizer=models.tokenizer_id(tok))
    ex, how = sft.build_examples(mixed, tok)
    assert how == "token columns, 1 row by chat template"
    assert ex["input_ids"][0] == [1, 2, 10, 11] and ex["input_ids"][2] == [3, 12]
    assert (ex["input_ids"][1], ex["completion_mask"][1]) == sft.render_masked(msgs[1], tok)
    half = schema.with_provenance(table.set_column(3, "loss_mask", schema.array("loss_mask", [[1, 0], [1], [1]])),
                                  "rollout", tokenizer=models.tokenizer_id(tok))
    with pytest.raises(InputError, match="prompt_ids null but other token columns set") as e:
        sft.build_examples(half, tok)
    assert (e.value.row, e.value.column) == (1, "prompt_ids")


def test_removed_min_reward_names_atom_rft():
    from atomcli import config as cfgmod
    for given in ({"min_reward": 0.5}, {"min-reward": "0.5"}):
        with pytest.raises(InputError, match="atom rft"):
            cfgmod.build(sft.SFTConfig, {}, given)
    p = atom("sft", "nothing.jsonl", "--out", "ckpt", "--min-reward", "0.5")
    assert p.returncode == 2 and b"--min-reward was removed" in p.stderr and b"atom rft" in p.stderr


def test_cli_sft_lowers_the_loss_and_writes_a_plain_checkpoint(tiny_model, tmp_path):
    data = tmp_path / "sft.jsonl"
    table = pa.table({"messages": schema.array("messages", [messages(*f) for f in FACTS]), "reward": [1.0] * 4})
    tableio.write_table(table, str(data))
    out = tmp_path / "ckpt"
    proc = atom("sft", data, "--model", tiny_model, "--out", out, "--max-steps", "6", "--lr", "1e-2",
                "--no-gradient-checkpointing", "--batch-size", "4", "--lr-scheduler", "constant", check=True,
                env={"ATOM_DEBUG": ""})
    assert proc.stdout == b""  # TRL's log lines went to stderr
    # and stderr holds atomcli's lines only: no library warnings or progress bars
    for noise in (b"Warning", b"Loading weights", b"train dataset", b"Writing model shards", b"it/s]"):
        assert noise not in proc.stderr, noise
    assert b"sft: 6 steps" in proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 6 and metrics["source"] == "chat template"
    assert metrics["train_loss_last"] < metrics["train_loss_first"] - 1.0
    state = json.loads((out / "atom_state.json").read_text())
    assert state["stage"] == "sft" and state["step"] == 0 and not state["optimizer"]
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.use_cache


def test_sft_lora_merges_into_a_plain_checkpoint(tiny_model, tok):
    table = pa.table({"messages": schema.array("messages", [messages(*f) for f in FACTS[:2]])})
    res = sft.run(table, sft.SFTConfig(model=str(tiny_model), lora=True, lora_r=4, lr=1e-2, max_steps=2,
                                       batch_size=2), Context(quiet=True))
    assert not hasattr(res.model, "peft_config") and not res.lora
    base, _ = models.load(str(tiny_model))
    names = dict(res.model.named_parameters())
    assert not any("lora" in n for n in names)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(names[q], dict(base.named_parameters())[q])


def test_bf16_autocasts_the_matmuls_and_keeps_fp32_weights(tiny_model, tmp_path):
    """--precision bf16 on a CPU: the loss still falls, the saved weights are fp32 and differ from an
    fp32 run's (so bf16 really ran); an unknown precision is a one-line error listing the valid ones."""
    table = pa.table({"messages": schema.array("messages", [messages(*f) for f in FACTS])})
    cfg = dict(model=str(tiny_model), lr=1e-2, max_steps=4, batch_size=4, lr_scheduler="constant",
               gradient_checkpointing=False)
    bf = sft.run(table, sft.SFTConfig(**cfg, precision="bf16"), Context(quiet=True))
    fp = sft.run(table, sft.SFTConfig(**cfg, precision="fp32"), Context(quiet=True))
    assert bf.metrics["train_loss_last"] < bf.metrics["train_loss_first"] - 0.5
    q = "model.layers.0.self_attn.q_proj.weight"
    wb, wf = dict(bf.model.named_parameters())[q], dict(fp.model.named_parameters())[q]
    assert wb.dtype == torch.float32 and not torch.equal(wb, wf)
    data = tmp_path / "sft.jsonl"
    tableio.write_table(table, str(data))
    proc = atom("sft", data, "--model", tiny_model, "--out", tmp_path / "c", "--precision", "fp16")
    assert proc.returncode == 2 and b"auto, bf16, fp32" in proc.stderr and not (tmp_path / "c").exists()


def test_two_process_launch_matches_one_process(tiny_model, tmp_path):
    """torchrun with 2 ranks x batch 2 trains like one process with batch 4, and only rank 0 writes."""
    from safetensors.torch import load_file
    data = tmp_path / "sft.parquet"
    rows = [messages(*f) for f in FACTS] * 2
    tableio.write_table(pa.table({"messages": schema.array("messages", rows)}), str(data))
    flags = ["--max-steps", "3", "--lr", "1e-2", "--no-gradient-checkpointing", "--lr-scheduler", "constant"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "atomcli", "sft", str(data), "--model", str(tiny_model), "--out", str(tmp_path / "ddp"),
                           "--batch-size", "2", *flags], capture_output=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert proc.stderr.decode().count("wrote ") == 1  # rank 1 neither writes nor reports
    atom("sft", data, "--model", tiny_model, "--out", tmp_path / "one", "--batch-size", "4", *flags, check=True)
    ddp, one = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("ddp", "one"))
    assert ddp["train_losses"] == pytest.approx(one["train_losses"], rel=1e-5)
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("ddp", "one"))
    base = load_file(tiny_model / "model.safetensors")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4
    assert max((base[k] - b[k]).abs().max().item() for k in b) > 1e-2  # and it did train


def test_length_sampling_batches_rows_of_similar_length(tiny_model, tok):
    """--sampling length: every row once an epoch, in batches that pad less than random ones (the rows are
    grouped within random quarters of the set, so not all alike); an unknown
    sampling is refused with the valid names."""
    rows = [messages(f"question {i} " + "about a long topic " * (i % 8) * 6, f"Answer{i}") for i in range(96)]
    table = pa.table({"messages": schema.array("messages", rows)})
    examples, _ = sft.build_examples(table, tok)
    model, _ = models.load(str(tiny_model))

    def padding(sampling, pad_multiple=0):
        config = sft.SFTConfig(batch_size=4, sampling=sampling, pad_multiple=pad_multiple)
        trainer, out_dir = sft._trainer(model, tok, examples, config)
        shutil.rmtree(out_dir)  # TRL's output folder; nothing is trained here
        torch.manual_seed(0)
        seen, pad, total = [], 0, 0
        for batch in trainer.get_train_dataloader():
            mask = batch["attention_mask"]
            assert mask.shape[1] % (pad_multiple or 1) == 0
            pad, total = pad + int((mask == 0).sum()), total + mask.numel()
            seen += [tuple(x[m.bool()].tolist()) for x, m in zip(batch["input_ids"], mask)]
        assert sorted(seen) == sorted(tuple(x) for x in examples["input_ids"])  # every row, once
        return pad / total

    grouped, shuffled = padding("length"), padding("random")
    assert grouped < 0.6 * shuffled and shuffled > 0.1
    # --pad-multiple: every batch as wide as a multiple of it (the kept heap sees few tensor sizes), so more padding
    assert padding("random", pad_multiple=64) > shuffled
    with pytest.raises(InputError, match="length, random"):
        sft.run(table, sft.SFTConfig(model=str(tiny_model), sampling="sorted"), Context(quiet=True))


@pytest.mark.parametrize("on", [False, True])
def test_checkpointing_reaches_the_trainer_without_a_deprecation_warning(tiny_model, tok, on):
    """`gradient_checkpointing` is passed under the name the installed transformers has (5.25 renamed it to
    `activation_checkpointing` and warns at every SFT on the old one), and both names read the setting."""
    import warnings
    table = pa.table({"messages": schema.array("messages", [messages(q, a) for q, a in FACTS])})
    examples, _ = sft.build_examples(table, tok)
    model, _ = models.load(str(tiny_model))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, out_dir = sft._trainer(model, tok, examples, sft.SFTConfig(gradient_checkpointing=on))
    shutil.rmtree(out_dir)
    assert not [w for w in caught if "checkpointing" in str(w.message)]
    assert trainer.args.gradient_checkpointing is on
    assert getattr(trainer.args, "activation_checkpointing", on) is on
