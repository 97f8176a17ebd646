"""The policy that run-all keeps in memory between GRPO steps (a resident loop).

`atom grpo-step` reads its policy, AdamW state and reference from checkpoint folders and writes a
new folder. run-all chains the same stage N times in one process, so reading back what it has just
written is wasted work (at 7B, tens of GB a step). Instead, run-all keeps the result of each update
as a `ResidentPolicy` on its context (`Context.resident`) and the next step's stages take it from
there:

- rollout, eval and score-ig ask the context for the model of the step's checkpoint
  (`Context.model(spec)`). When `spec` names the checkpoint this policy stands for, saved or not
  (`stands_for`), they get its module (`sampler`);
- grpo-step (atomcli.stages.grpo_step) continues from `model`, `optimizer_state` and `state`
  instead of reading the folder. It keeps a separately loaded KL reference here (`reference`), so
  that reference is loaded once per run, not once per step; it waits in host memory between its
  passes, so the update's peak device memory is what a lone grpo-step needs. The update changes the module and the
  AdamW moments in place: after grpo-step, run-all replaces the resident with the new result.

It holds what the folder would hold: the trained module (the weights save_pretrained writes),
AdamW's state dict in the layout of `optimizer.pt` (the same fp32 tensors, never serialized), and
the atom_state.json the folder would get (checkpoint.make_state). A step continued from memory
therefore equals one continued from the saved folder bit for bit, and run-all writes the folder
only every `save_every` steps.

With LoRA the module is the peft model (base + adapter, which grpo-step keeps training). The
samplers get a merged copy, made once per update in the same way as the saved top-level weights
(base + delta), so rollouts do not depend on whether the folder was saved.

One process only: under a multi-process launch the module would be sharded, and run-all runs in a
single process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


def folder_id(spec: str) -> str:
    """A checkpoint folder as one string, whether or not it exists yet (absolute, resolved)."""
    return str(Path(spec).expanduser().resolve())


@dataclass
class ResidentPolicy:
    spec: str                      # folder_id of the checkpoint this stands for (saved or not)
    model: Any                     # the trained module (a peft model when state["lora"])
    tokenizer: Any
    optimizer_state: dict | None   # AdamW's state_dict, as optimizer.pt would hold it
    state: dict                    # the checkpoint's atom_state.json (step, ref, lora, updates, history)
    ref_spec: str | None = None    # the separately loaded KL reference, kept across steps
    ref_model: Any = None
    _merged: Any = field(default=None, repr=False)
    _cast: tuple | None = field(default=None, repr=False)  # (dtype, copy): the sampling copy in another dtype

    def stands_for(self, spec: str) -> bool:
        return folder_id(spec) == self.spec

    def sampler(self, dtype: str = "float32") -> tuple[Any, Any]:
        """(model, tokenizer) to sample and score with: the module, or with LoRA its merged copy; in
        another `dtype` (rollout --precision bf16) a copy of that, made once per update."""
        import copy
        if not self.state.get("lora"):
            module = self.model
        else:
            if self._merged is None:
                self._merged = copy.deepcopy(self.model).merge_and_unload()  # base + delta, as saved
                self._merged.eval()
            module = self._merged
        if dtype == "float32":
            return module, self.tokenizer
        if self._cast is None or self._cast[0] != dtype:
            import torch
            self._cast = None  # the old copy goes before the new one is made
            cast = copy.deepcopy(module).to(getattr(torch, dtype))
            cast.eval()
            self._cast = (dtype, cast)
        return self._cast[1], self.tokenizer

    def reference(self, spec: str, load: Callable[[], Any]) -> Any:
        """The KL reference model `spec`: loaded by `load` the first time, then kept."""
        if self.ref_spec != spec or self.ref_model is None:
            self.ref_model, self.ref_spec = None, None  # the old one goes before the new one loads
            self.ref_model, self.ref_spec = load(), spec
        return self.ref_model

    def successor(self, spec: str, result, state: dict) -> "ResidentPolicy":
        """The policy after an update (`result`: checkpoint.TrainResult), standing for folder `spec`;
        the reference stays loaded."""
        return ResidentPolicy(folder_id(spec), result.model, result.tokenizer, result.optimizer_state, state,
                              self.ref_spec, self.ref_model)

    @classmethod
    def first(cls, spec: str, result, state: dict) -> "ResidentPolicy":
        return cls(folder_id(spec), result.model, result.tokenizer, result.optimizer_state, state)


def after_update(current: ResidentPolicy | None, model: str, dest: str, result, config) -> ResidentPolicy:
    """The resident after a grpo-step update of checkpoint `model` whose result stands for folder
    `dest` (saved or not). Its atom_state (`.state`, what checkpoint.save writes) continues the
    current resident's when that resident is `model` (the in-memory parent may not be saved);
    otherwise the policy came from disk and the state starts from the folder's."""
    from atomcli import checkpoint
    parent = current if current is not None and current.stands_for(model) else None
    state = checkpoint.make_state(result, stage="grpo-step", config=config,
                                  parent=parent.state if parent is not None else None)
    if parent is not None:
        return parent.successor(dest, result, state)
    return ResidentPolicy.first(dest, result, state)
