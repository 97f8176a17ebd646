"""The memory estimate of a training stage, and the refusal of a run that cannot fit before its first step."""

from __future__ import annotations

import json

import pytest
from conftest import atom

from atomcli.errors import InputError
from atomcli.train import memory

SMOL = memory.Shape(params=134_515_008, layers=30, hidden=576, intermediate=1536)


def test_checkpointing_and_smaller_batches_lower_the_estimate():
    full = memory.training_bytes(SMOL, batch_rows=2, tokens_per_row=2048, checkpointing=False)
    half = memory.training_bytes(SMOL, batch_rows=1, tokens_per_row=2048, checkpointing=False)
    ckpt = memory.training_bytes(SMOL, batch_rows=2, tokens_per_row=2048, checkpointing=True)
    lora = memory.training_bytes(SMOL, batch_rows=2, tokens_per_row=2048, checkpointing=False, trainable_params=0)
    assert ckpt < full and half < full
    assert memory.training_bytes(SMOL, batch_rows=1, tokens_per_row=2048, checkpointing=True) < half
    # the demo SFT's worst batch peaked at 12.9 GB (batch 2), 7.6 GB (batch 1) and 9.7 GB (batch 2, checkpointing)
    # in bench/bench_sft_memory.py: the estimate must not lie below a measured peak
    for est, peak in ((full, 12.9), (half, 7.6), (ckpt, 9.7)):
        assert peak * memory.GB <= est <= 1.3 * peak * memory.GB
    assert lora < full
    # the real preset's SFT (bf16 autocast, batches of 2 up to 2,048 tokens) peaked at 7.6 GB on its 4 longest rows
    # and 9.8 GB over its first 24 steps (kept heap included): the estimate lies above both, below the fp32 one, and
    # under the 13 GB that a 16 GB laptop leaves (the fp32 arithmetic asked 13.2 GB and refused such a machine)
    bf16 = memory.training_bytes(SMOL, batch_rows=2, tokens_per_row=2048, checkpointing=False, precision="bf16")
    assert 9.8 * memory.GB <= bf16 <= min(1.5 * 7.6 * memory.GB, 12 * memory.GB) and bf16 < full
    # activations scale with the tokens of a micro-batch: halving the rows saves the same as halving the length
    assert half == memory.training_bytes(SMOL, batch_rows=2, tokens_per_row=1024, checkpointing=False)


def test_refusal_names_need_availability_and_the_settings_that_lower_it(monkeypatch):
    monkeypatch.delenv(memory.CAP_ENV, raising=False)
    monkeypatch.delenv(memory.SKIP_ENV, raising=False)
    with pytest.raises(InputError) as e:
        memory.check_fits("sft", 10 * memory.GB, "lower --batch-size", available=4 * memory.GB)
    line = e.value.one_line()
    assert "needs about 10.0 GB" in line and "4.0 GB is available" in line and "--batch-size" in line
    memory.check_fits("sft", 3 * memory.GB, "x", available=4 * memory.GB)  # fits: no error
    with pytest.raises(InputError) as e:  # figures that round alike get more digits
        memory.check_fits("sft", int(13.24 * memory.GB), "x", available=int(13.21 * memory.GB))
    assert "needs about 13.24 GB" in e.value.one_line() and "13.21 GB is available" in e.value.one_line()
    monkeypatch.setenv(memory.CAP_ENV, "2")  # a smaller machine than this one
    with pytest.raises(InputError):
        memory.check_fits("sft", 3 * memory.GB, "x", available=4 * memory.GB)
    monkeypatch.setenv(memory.SKIP_ENV, "0")
    memory.check_fits("sft", 3 * memory.GB, "x", available=4 * memory.GB)  # the user asked to try anyway


def test_a_cap_that_is_not_a_number_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv(memory.CAP_ENV, "lots")
    with pytest.raises(InputError, match="ATOM_MEMORY_GB"):
        memory.check_fits("sft", 1, "x", available=4 * memory.GB)


def test_sft_that_cannot_fit_stops_before_training_and_writes_nothing(tiny_model, tmp_path):
    row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<answer>a</answer>"}]}
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps(row) + "\n")
    out = tmp_path / "ckpt"
    r = atom("sft", str(data), "--model", str(tiny_model), "--out", str(out), "--max-steps", "1",
             env={memory.CAP_ENV: "0.01"})
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert "needs about" in err and "--gradient-checkpointing" in err
    assert "sft: 1 steps" not in err and not out.exists()


def test_grpo_estimate_lies_above_the_demo_update_and_fits_a_16_gb_laptop():
    # the demo's GRPO update (4 rows padded to 1,072 tokens, checkpointing) took its process to 4.49 million kB
    est = memory.training_bytes(SMOL, batch_rows=4, tokens_per_row=1072, checkpointing=True,
                                checkpointed_share=memory.GRPO_CHECKPOINTED_SHARE)
    assert 4.49e6 * 1024 <= est <= 8 * memory.GB
    sft_share = memory.training_bytes(SMOL, batch_rows=4, tokens_per_row=1072, checkpointing=True)
    assert sft_share > 11 * memory.GB  # what the SFT-fitted share would have asked for


def test_what_the_process_already_holds_counts_as_usable(monkeypatch):
    import types

    import torch

    from atomcli import heap
    tiny = types.SimpleNamespace(config=types.SimpleNamespace(num_hidden_layers=2, hidden_size=8, intermediate_size=16),
                                 parameters=lambda: [torch.zeros(10)])
    need = memory.training_bytes(memory.Shape.of(tiny), batch_rows=1, tokens_per_row=16, checkpointing=False)
    monkeypatch.setattr(memory, "available_bytes", lambda: need - memory.GB // 2)   # short by half a GB...
    monkeypatch.setattr(heap, "resident_mb", lambda: 1024.0)                         # ...that the process holds
    memory.check_training("sft", tiny, batch_rows=1, tokens_per_row=16, checkpointing=False, hint="x")
    monkeypatch.setattr(heap, "resident_mb", lambda: 0.0)
    with pytest.raises(InputError, match="sft needs about"):
        memory.check_training("sft", tiny, batch_rows=1, tokens_per_row=16, checkpointing=False, hint="x")


def test_a_stage_that_fits_only_inside_the_kept_heaps_reserve_gets_a_warning(monkeypatch):
    """It fits, but its peak leaves less free than the guard's reserve: the heap would be handed back at about every
    step. The warning names the settings that lower the peak; without a guard (heap not kept) there is none."""
    from atomcli import heap, sysmem
    gb = memory.GB
    monkeypatch.delenv(memory.CAP_ENV, raising=False)
    monkeypatch.delenv(memory.SKIP_ENV, raising=False)
    monkeypatch.setattr(sysmem, "meminfo", lambda: {"MemTotal": 13 * gb, "MemAvailable": 12 * gb})
    monkeypatch.setattr(heap, "guard", heap.Guard(None, share=0.2))
    assert memory.check_fits("sft", 9 * gb, "lower --batch-size", available=12 * gb) is None  # 3 GB left >= 2.6
    note = memory.check_fits("sft", 10 * gb, "lower --batch-size", available=12 * gb)       # 2 GB left
    assert note is not None and "leaves 2.0 GB free" in note and "reserve of 2.6 GB" in note
    assert "lower --batch-size" in note
    monkeypatch.setenv(memory.CAP_ENV, "11")  # the reserve of the smaller machine the cap stands for: 2.2 GB
    assert "reserve of 2.2 GB" in memory.check_fits("sft", 9 * gb, "x", available=12 * gb)
    monkeypatch.delenv(memory.CAP_ENV)
    monkeypatch.setattr(heap, "guard", None)
    assert memory.check_fits("sft", 10 * gb, "x", available=12 * gb) is None


def test_sft_logs_the_warning_when_its_peak_would_eat_into_the_reserve(tiny_model, tmp_path):
    import transformers
    row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<answer>a</answer>"}]}
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps(row) + "\n")
    shape = memory.Shape.of(transformers.AutoModelForCausalLM.from_pretrained(tiny_model))
    need = memory.training_bytes(shape, batch_rows=1, tokens_per_row=256, checkpointing=False, precision="fp32")
    flags = ["--max-steps", "1", "--batch-size", "1", "--grad-accum", "1", "--pad-multiple", "256", "--precision",
             "fp32", "--no-gradient-checkpointing"]
    for share_left, warned in ((0.1, True), (0.3, False)):  # of the capped machine, against a reserve of 0.2
        cap = need / (1 - share_left) / memory.GB
        r = atom("sft", str(data), "--model", str(tiny_model), "--out", str(tmp_path / f"ckpt-{warned}"), *flags,
                 env={memory.CAP_ENV: f"{cap:.6f}", "ATOM_HEAP": "retain", "ATOM_HEAP_RESERVE": "0.2"})
        err = " ".join(r.stderr.decode().split())  # the console wraps long lines
        assert r.returncode == 0, err
        assert ("under the kept heap's reserve" in err) is warned, err
        assert "sft: 1 steps" in err
