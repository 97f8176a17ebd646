"""atomcli.train.resident.after_update: the hand-over of the in-memory policy after a grpo-step update,
as run-all calls it (no model: the update's result is a stand-in)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from atomcli import checkpoint
from atomcli.train.resident import ResidentPolicy, after_update, folder_id


def result(base: str, step: int) -> SimpleNamespace:
    return SimpleNamespace(model=object(), tokenizer=object(), optimizer_state={"state": {}}, step=step, base=base,
                           ref=base, lora=False, lora_base=None, extra={})


def test_the_resident_continues_its_own_state_and_keeps_its_reference(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")  # neither folder is saved: the chain lives in memory
    ref = object()
    current = ResidentPolicy(folder_id(a), object(), object(), None,
                             {"history": [{"stage": "sft", "step": 5, "from": "base"}]}, "ref", ref)
    new = after_update(current, a, b, result(a, 6), {"lr": 1e-5})
    assert new.stands_for(b) and not new.stands_for(a)
    assert [h["stage"] for h in new.state["history"]] == ["sft", "grpo-step"]
    assert new.state["step"] == 6 and new.state["config"] == {"lr": 1e-5}
    assert new.ref_model is ref and new.ref_spec == "ref"


def test_a_policy_read_from_disk_starts_from_the_folders_state(tmp_path):
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / checkpoint.STATE_FILE).write_text(json.dumps({"history": [{"stage": "sft", "step": 40, "from": "x"}]}))
    other = ResidentPolicy(folder_id(str(tmp_path / "elsewhere")), object(), object(), None,
                           {"history": [{"stage": "never", "step": 1, "from": "y"}]}, "ref", object())
    for current in (None, other):  # no resident, or one that stands for another checkpoint
        new = after_update(current, str(sft), str(tmp_path / "step1"), result(str(sft), 1), None)
        assert new.stands_for(str(tmp_path / "step1"))
        assert [h["stage"] for h in new.state["history"]] == ["sft", "grpo-step"]
        assert new.ref_model is None
