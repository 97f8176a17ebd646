"""SFT's LM head on labelled positions only, on every device.

TRL's SFTTrainer (1.16) runs the LM head through its fused, chunked log-prob function, which never builds the
(batch, length, vocab) logits. On CUDA/XPU it projects only the positions that carry a label; elsewhere it scores
every position and zeroes the unlabelled ones afterwards, because on Neuron a changing number of rows would
recompile its kernels. A CPU recompiles nothing, and in an agent's trajectory most positions are prompt and tool
text without a label (about three quarters of the real preset's SFT tokens), so on a CPU the vocabulary projection,
its softmax and their backward ran about four times more rows than the loss uses.

`labelled_positions_only()` makes TRL take its compact path wherever the device is not one that recompiles. The
loss and the gradients are the same sums over the same labelled positions (a test compares them); only the
unlabelled rows' work is skipped. It patches one private TRL function for the duration of the block. A TRL without
that function trains as TRL does (slower on a CPU, not wrong), and tests/test_labelled_head.py, which counts the rows
the head sees, fails so that the patch gets updated.
"""

from __future__ import annotations

import contextlib

# Device types on which TRL scores every position to keep its compiled tile shapes fixed.
_RECOMPILING = ("xla", "neuron", "hpu")


@contextlib.contextmanager
def labelled_positions_only():
    """Within the block, TRL's fused LM head projects only labelled positions on CPU (and MPS) as well."""
    from trl.trainer import utils as trl_utils

    original = getattr(trl_utils, "_use_triton", None)
    if original is None:  # another TRL: its own head, every position scored off CUDA
        yield
        return

    def compact(device) -> bool:
        return original(device) or device.type not in _RECOMPILING

    trl_utils._use_triton = compact
    try:
        yield
    finally:
        trl_utils._use_triton = original
