"""grpo-step through accelerate: precision, uneven micro-batch counts under DDP, FSDP2 on CPU.

What runs here (CPU, gloo): one process, DDP (torchrun, 2 processes) and FSDP2. accelerate 1.15
enables FSDP only for GPU-type launches (AcceleratorState turns it on for MULTI_GPU, MULTI_XPU,
... but not MULTI_CPU; on CPU `accelerate launch --use_fsdp` runs DDP), while torch's FSDP2
(`fully_shard`) itself runs on CPU with gloo. So the FSDP test launches grpo-step through a
small driver that sets accelerate's state to FSDP2 after the Accelerator is made: everything
after that (accelerate's fsdp2 prepare and auto-wrap, clip_grad_norm_, get_state_dict, the
gathered and re-sharded AdamW state) is the code a GPU launch runs. DeepSpeed is not tested:
it is not installed and needs GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT
from test_grpo_step import _max_diff, cfg, load, make_table, quiet, weights

from atomcli import checkpoint, tableio
from atomcli.errors import InputError
from atomcli.stages import grpo_step
from atomcli.train import grpo

FSDP_DRIVER = '''
import sys
from accelerate.state import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from atomcli.train import accel

_make = accel.make_accelerator

def fsdp2(precision="auto"):
    acc = _make(precision)
    # accelerate 1.15 enables FSDP only on GPU launches; torch's FSDP2 runs on CPU with gloo
    acc.state.fsdp_plugin = FullyShardedDataParallelPlugin(fsdp_version=2, cpu_ram_efficient_loading=False)
    acc.state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # what AcceleratorState copies back
    return acc

accel.make_accelerator = fsdp2
from atomcli.cli import main
main()
'''


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_model)


def launch(tmp_path, *args, script=None):
    """`atom ARGS` in two processes (torchrun, gloo); `script` replaces `-m atomcli`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    target = [str(script)] if script else ["-m", "atomcli"]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           *target, *map(str, args)], capture_output=True, env=env, cwd=ROOT, timeout=900)
    err = proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, err[-4000:]
    assert "terminate called" not in err  # teardown: both ranks leave the process group cleanly
    return err


def test_precision_flag(tiny_model, tok):
    table = make_table(tok, n=3)
    with pytest.raises(InputError, match="precision") as e:
        grpo_step.run(table, cfg(tiny_model, precision="fp16"), quiet())
    assert "bf16" in e.value.hint
    fp32 = grpo_step.run(table, cfg(tiny_model), quiet())
    assert fp32.metrics["precision"] == "fp32"  # auto on a machine without a GPU
    # bf16 autocast (CPU supports it); the weights and AdamW state stay fp32. A second precision in
    # the same process must work too (accelerate's state is process-wide)
    bf16 = grpo_step.run(table, cfg(tiny_model, precision="bf16"), quiet())
    assert bf16.metrics["precision"] == "bf16"
    assert next(bf16.model.parameters()).dtype == torch.float32
    assert bf16.metrics["loss"] == pytest.approx(fp32.metrics["loss"], rel=0.05, abs=1e-3)
    assert bf16.metrics["grad_norm"] == pytest.approx(fp32.metrics["grad_norm"], rel=0.02)
    # AdamW's first step is ~lr*sign(g): bf16 noise flips the sign of near-zero gradients, so compare the
    # update's direction, not its largest entry
    start = weights(load(tiny_model))
    delta = lambda r: torch.cat([(v - start[k]).flatten() for k, v in weights(r.model).items()])  # noqa: E731
    assert torch.nn.functional.cosine_similarity(delta(bf16), delta(fp32), dim=0) > 0.9
    again = grpo_step.run(table, cfg(tiny_model, precision="fp32"), quiet())
    assert _max_diff(weights(again.model), weights(fp32.model)) == 0


def test_ddp_with_uneven_micro_batch_counts_matches_one_process(tiny_model, tmp_path, tok):
    # three live rows (the zeros are skipped): rank 0 trains two, rank 1 one, one per micro-batch,
    # so rank 1 adds a weight-0 pass to keep DDP's passes in step
    table = make_table(tok, n=6, advantages=[0.9, 0.0, -0.9, 0.0, 0.0, 0.5])
    batch = grpo_step.read_batch(table, skip_zero=True)
    settings = grpo.LossSettings(micro_batch=1)
    counts = [len(grpo.micro_batches(batch, settings, grpo.World(r, 2), torch.device("cpu"))) for r in (0, 1)]
    assert counts == [2, 1]
    data = tmp_path / "rewarded.parquet"
    tableio.write_table(table, str(data))
    launch(tmp_path, "grpo-step", data, "--model", tiny_model, "--out", tmp_path / "ddp", "--lr", "1e-3",
           "--beta", "0", "--micro-batch", "1", "--epochs", "2")
    single = grpo_step.run(table, cfg(tiny_model, micro_batch=1, epochs=2), quiet())
    ddp = json.loads((tmp_path / "ddp" / "metrics.json").read_text())
    assert ddp["world_size"] == 2 and ddp["distributed"] == "MULTI_CPU" and ddp["skipped_zero_advantage"] == 3
    assert ddp["loss"] == pytest.approx(single.metrics["loss"], rel=1e-5)
    assert ddp["last_update"]["grad_norm"] == pytest.approx(single.metrics["last_update"]["grad_norm"], rel=1e-5)
    moved = _max_diff(weights(single.model), weights(load(tiny_model)))
    # the loss and gradient norm agree to 1e-5 above; the weights after two AdamW updates agree to a few
    # percent of how far they moved: the ranks sum their micro-batches in another order than one process
    # (and with OMP_NUM_THREADS=1), and AdamW's g/sqrt(v) turns 1-ulp gradient differences on elements
    # with tiny gradients into visible ones (measured: up to 3% of the movement). A lost or doubled
    # micro-batch moves the weights by the order of `moved` itself.
    assert moved > 1e-4 and _max_diff(weights(load(tmp_path / "ddp")), weights(single.model)) < 0.1 * moved


def test_fsdp2_two_processes_match_one_and_resume(tiny_model, tmp_path, tok):
    """Two FSDP2 steps (the second resumes the gathered AdamW state, re-sharded) equal one process's
    two-epoch update; the checkpoint's optimizer.pt is the plain full state dict."""
    driver = tmp_path / "fsdp_driver.py"
    driver.write_text(FSDP_DRIVER)
    table = make_table(tok, n=5)  # rank 0 trains three rows, rank 1 two (micro-batch 1): a weight-0 pass
    data = tmp_path / "rewarded.parquet"
    tableio.write_table(table, str(data))
    flags = ["--lr", "1e-3", "--beta", "0.1", "--micro-batch", "1"]
    launch(tmp_path, "grpo-step", data, "--model", tiny_model, "--out", tmp_path / "f1", *flags, script=driver)
    launch(tmp_path, "grpo-step", data, "--model", tmp_path / "f1", "--out", tmp_path / "f2", *flags, script=driver)
    m1 = json.loads((tmp_path / "f1" / "metrics.json").read_text())
    m2 = json.loads((tmp_path / "f2" / "metrics.json").read_text())
    assert m1["distributed"] == "FSDP" and m1["world_size"] == 2 and m2["step"] == 2

    both = grpo_step.run(table, cfg(tiny_model, beta=0.1, micro_batch=1, epochs=2), quiet())
    assert m1["loss"] == pytest.approx(both.metrics["loss"], rel=1e-5)
    assert m2["loss"] == pytest.approx(both.metrics["last_update"]["loss"], rel=1e-5)
    assert m2["grad_norm"] == pytest.approx(both.metrics["last_update"]["grad_norm"], rel=1e-4)
    moved = _max_diff(weights(both.model), weights(load(tiny_model)))
    assert _max_diff(weights(load(tmp_path / "f2")), weights(both.model)) < max(1e-5, 1e-3 * moved)

    opt = checkpoint.read_optimizer_state(str(tmp_path / "f1"))
    n_params = sum(1 for p in load(tiny_model).parameters() if p.requires_grad)
    assert sorted(opt["state"]) == list(range(n_params))  # one process resumes it as is
    assert all(not hasattr(v, "device_mesh") for s in opt["state"].values() for v in s.values())
    first = grpo_step.run(table, cfg(tiny_model, beta=0.1, micro_batch=1), quiet())
    for i, s in opt["state"].items():
        assert torch.allclose(s["exp_avg"], first.optimizer_state["state"][i]["exp_avg"], rtol=1e-4, atol=1e-9)
