"""Checkpoint folders: atomic writes, state and optimizer round trips, out-of-place LoRA merge."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from atomcli import checkpoint
from atomcli.errors import InputError


@pytest.fixture()
def tiny(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    return AutoModelForCausalLM.from_pretrained(tiny_model).eval(), AutoTokenizer.from_pretrained(tiny_model)


def test_save_writes_a_loadable_folder_with_state_optimizer_and_metrics(tiny, tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM
    model, tok = tiny
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[5, 6, 7]])).logits.sum().backward()
    opt.step()
    res = checkpoint.TrainResult(model=model, tokenizer=tok, step=3, metrics={"loss": 0.5, "bad": float("nan")},
                                 base=str(tiny_model), optimizer_state=opt.state_dict(), ref=str(tiny_model))
    checkpoint.save(res, tmp_path / "c1", stage="grpo-step", config={"lr": 1e-3, "api_key": "sk-secret"})
    out = tmp_path / "c1"
    state = checkpoint.read_state(str(out))
    assert state["step"] == 3 and state["stage"] == "grpo-step" and state["ref"] == str(tiny_model)
    assert state["config"] == {"lr": 1e-3}  # secrets never reach the folder
    assert json.loads((out / "metrics.json").read_text())["loss"] == 0.5
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert all(torch.equal(a, b) for a, b in zip(reloaded.state_dict().values(), model.state_dict().values()))
    saved = checkpoint.read_optimizer_state(str(out))
    fresh = torch.optim.AdamW(reloaded.parameters(), lr=1e-3)
    fresh.load_state_dict(saved)
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])

    # a second checkpoint made from the first extends the history
    res2 = checkpoint.TrainResult(model=model, tokenizer=tok, step=4, metrics={}, base=str(out))
    checkpoint.save(res2, tmp_path / "c2", stage="grpo-step")
    history = checkpoint.read_state(str(tmp_path / "c2"))["history"]
    assert [h["step"] for h in history] == [3, 4] and history[1]["from"] == str(out)
    assert not (tmp_path / "c2" / "optimizer.pt").exists()


class Exploding:
    def save_pretrained(self, path, **kw):
        (path / "partial.bin").write_bytes(b"half")
        raise RuntimeError("disk full")


def test_a_failed_save_leaves_no_partial_folder_and_keeps_the_old_one(tiny, tmp_path):
    _, tok = tiny
    bad = checkpoint.TrainResult(model=Exploding(), tokenizer=tok, step=1, metrics={}, base="x")
    with pytest.raises(RuntimeError):
        checkpoint.save(bad, tmp_path / "new", stage="grpo-step")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "keep.txt").write_text("v1")
    with pytest.raises(RuntimeError):
        checkpoint.save(bad, tmp_path / "old", stage="grpo-step")
    assert [p.name for p in tmp_path.iterdir()] == ["old"]
    assert (tmp_path / "old" / "keep.txt").read_text() == "v1"


def test_merged_state_dict_matches_peft_merge_without_touching_the_model(tiny):
    from peft import LoraConfig, get_peft_model
    model, _ = tiny
    original = {k: v.clone() for k, v in model.state_dict().items()}
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)  # B starts at zero; make the adapter do something
    x = torch.tensor([[3, 9, 27, 81]])
    before = peft_model(x).logits.detach()
    merged = checkpoint.merged_state_dict(peft_model)
    assert torch.equal(peft_model(x).logits.detach(), before)  # still an unmerged, active adapter
    reference = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    assert set(merged) == set(reference)
    assert all(torch.allclose(merged[k], reference[k], atol=1e-6) for k in reference)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(merged[q], original[q], atol=1e-4)  # the delta is really in
    assert torch.equal(merged["model.norm.weight"], original["model.norm.weight"])


def test_spec_id_and_bad_state(tmp_path, monkeypatch):
    assert checkpoint.spec_id("smollm2") == "smollm2"
    (tmp_path / "ck").mkdir()
    monkeypatch.chdir(tmp_path)
    assert checkpoint.spec_id("ck") == str((tmp_path / "ck").resolve())
    assert checkpoint.read_state("ck") == {}
    (tmp_path / "ck" / "atom_state.json").write_text("{broken")
    with pytest.raises(InputError, match="atom_state.json"):
        checkpoint.read_state("ck")
