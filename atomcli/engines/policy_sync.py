"""Owns how a served policy is brought up to date: after each update, the OpenAI-compatible server
that samples the rollouts must serve the new checkpoint, and the rollout must know that it does.

With `--model openai:BASE_URL#MODEL`, run-all trains locally and samples through a server. A server
that never receives the new weights would make every step sample the starting policy while the
trainer's ratio assumes otherwise: training would silently do nothing useful. So run-all refuses
an `openai:` policy without `[run-all] policy_sync`, and before each rollout it makes the server
serve the checkpoint the rollout is for (`Follower.rollout_config`: sync on first use, so a resumed
run syncs the checkpoint it continues from). Each method checks that the server now serves the
new version before it returns, and the rollout checks again (`check_rollout`, a stale server is
refused with exit 2) and records the version in the `policy_version` column.

Methods (`[run-all] policy_sync` / `atom rollout --policy-sync`; each endpoint below was taken from the
named source, not guessed):

- `lora-vllm`: the checkpoint's LoRA adapter (`CKPT/adapter`, written by `grpo-step --lora`) is
  hot-loaded under a new name per version, `policy-<version>`, and rollouts ask for that name.
  `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` (200, a text body "Success: LoRA adapter
  ... added successfully"), `POST /v1/unload_lora_adapter {"lora_name"}` for the previous one, and
  `GET /v1/models` lists loaded adapters as models. Source: vLLM docs/features/lora.md, "Dynamically
  serving LoRA Adapters" (docs.vllm.ai/en/latest/features/lora/; added in vLLM 0.6.1, PR #6566) and
  `LoadLoRAAdapterRequest` in vllm/entrypoints/openai/protocol.py. The server needs
  `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` and `--enable-lora --max-lora-rank R` (R >= `lora_r`).
  A new name per version, rather than reloading one name, means a request can never be answered by a
  half-replaced adapter and the model name itself says which version answered. run-all lists the
  adapters it has loaded in `RUN/policy_sync.json`, so a resumed run unloads those its killed
  process left behind (and never another run's).
- `sglang-disk`: full weights from the checkpoint folder. `POST /update_weights_from_disk
  {"model_path", "weight_version"}` answers `{"success", "message", "num_paused_requests"}` (HTTP 400
  with success false on failure); `GET /model_info` (older releases: `/get_model_info`, now a
  deprecated alias) reports `model_path` and `weight_version`. Source: SGLang
  python/sglang/srt/entrypoints/http_server.py and `UpdateWeightFromDiskReqInput` in
  python/sglang/srt/managers/io_struct.py (docs.sglang.io/docs/basic_usage/native_api). SGLang
  answers base-model requests whatever their `model` field says, so the request name stays MODEL.
- `vllm-reload`: full weights from disk into a running vLLM. `POST /collective_rpc {"method":
  "reload_weights", "kwargs": {"weights_path", "is_checkpoint_format": true}}`, then `POST
  /update_weight_version {"new_version"}` and `GET /weight_info` -> `{"weight_version"}` to check.
  All three are development endpoints: `VLLM_SERVER_DEV_MODE=1`. Sources: `/collective_rpc` in
  vllm/entrypoints/openai/api_server.py (dev mode) with the reload call as vLLM PR #48284 shows it;
  the version endpoints from vLLM PR #49040 (weight version tagging, merged 2026-07; older vLLM has no
  `/weight_info`, and this method then fails with that hint). Caveat: vLLM issue #32718 (0.14) reports
  `reload_weights` returning cached weights; the version label cannot detect that, so check your vLLM.
  vLLM's *weight-transfer* API (`/init_weight_transfer_engine`, `/update_weights`, NCCL or CUDA-IPC
  backends; docs.vllm.ai/en/latest/training/weight_transfer/) moves tensors from a live trainer
  process, not a checkpoint path, so it is not a method here.
- `transformers-serve`: `transformers serve` (the CPU way; `pip install "atomcli[serve]"`) loads a model
  per local path, so each checkpoint is served under its own path: `POST /load_model {"model": PATH}`
  (an event stream ending in `{"status": "ready"}` or `{"status": "error", "message"}`), and
  rollouts ask for PATH. The check: `GET /v1/models` lists PATH (local models are listed while loaded)
  and the files at PATH still hash to the version (the server keeps a loaded model in memory, so files
  rewritten in place would not be what it serves). Old checkpoints unload after the server's
  `--model-timeout` idle seconds. Source: transformers/cli/serving/server.py and model_manager.py.
- `command:CMD`: runs the user's command with the checkpoint path and the version as its last two
  arguments (and `ATOM_POLICY_CHECKPOINT`, `ATOM_POLICY_VERSION`, `ATOM_POLICY_SERVER`,
  `ATOM_POLICY_MODEL` in its environment); a nonzero exit is retried (atomcli.retry), then a one-line
  error. A line `served_model=NAME` on its stdout makes rollouts ask for NAME (e.g. an adapter it
  loaded); the check is then that `GET /v1/models` lists that name. Which weights it holds is the
  command's word: no generic endpoint can say so.

The policy version names a checkpoint: its stage and step (`sft`, `step0003`, `init` for a model that
no atomcli stage wrote) and a hash of its policy files' names, sizes and modification times, e.g.
`step0003-4f1c2a9b0d`. Cheap (no weights are read) and different for every written checkpoint.

The checkpoint path is sent as it is seen here (absolute): the server must see the same filesystem.
The API key, if any, is OPENAI_API_KEY, as for the rollout engine; it never appears in a message.
A key written into the setting itself (`command:sync.sh -H "Authorization: Bearer sk-…"`) is refused
(atomcli.safety.check_no_secret), as in any SPEC: the setting is stored in config.json and provenance.
The command inherits the environment, so it reads the key there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from atomcli import openai_http, retry
from atomcli.errors import InputError, unknown_choice

METHODS = ("lora-vllm", "sglang-disk", "vllm-reload", "transformers-serve")
COMMAND_PREFIX = "command:"
SERVED_MODEL_LINE = "served_model="
ADAPTER_PREFIX = "policy-"
LEDGER = "policy_sync.json"  # in the run folder: the LoRA adapters a run left loaded on its server
# A 7B reload from disk takes seconds to a minute; a server that needs longer is stuck.
SYNC_TIMEOUT = 600.0
COMMAND_TIMEOUT = 3600.0
MAX_RESPONSE_BYTES = 4 << 20
# Files that make up the served policy (not the optimizer state, which the server never sees).
POLICY_FILES = ("config.json", "atom_state.json", "*.safetensors", "*.bin", "adapter/adapter_config.json",
                "adapter/*.safetensors", "adapter/*.bin")


class PolicySyncError(RuntimeError):
    """The server could not be brought to the new policy (it refused, or stayed down past the retries)."""


class _Refused(PolicySyncError):
    """A permanent HTTP error from the policy server (openai_http's permanent error type here)."""


@dataclass(frozen=True)
class Served:
    """What the server serves after a sync: the model name requests use, and the policy version."""
    model: str
    version: str


class SyncMethod(Protocol):
    """One way of bringing a server up to date. Everything run-all and the rollout use."""
    name: str

    def sync(self, checkpoint: str, version: str) -> Served:
        """Make the server serve `checkpoint` as `version`; returns once the server says it does."""
        ...

    def check(self, served: Served) -> str | None:
        """None when the server serves `served`; otherwise what it serves instead, in a few words."""
        ...


# --- specs and versions ------------------------------------------------------------------------

def check_spec(spec: str) -> None:
    """Fail on an unknown method name, or a key written into a command, before anything runs (no network)."""
    from atomcli.safety import check_no_secret
    check_no_secret(spec, "policy sync")  # the setting is stored (config.json, provenance): no key in it
    if spec.startswith(COMMAND_PREFIX):
        _command_argv(spec)
    elif spec not in METHODS:
        raise unknown_choice("policy sync method", spec, METHODS + ("command:CMD",))


def trainer_model(model: str) -> str:
    """The local weights the trainer starts from: MODEL of `openai:BASE#MODEL` (vLLM and SGLang serve a
    model under its path or hub id unless told otherwise), or `model` itself for an in-process policy."""
    if not model.startswith("openai:"):
        return model
    from atomcli.engines import openai as engine_openai
    return engine_openai.parse_spec(model)[1]


def policy_version(checkpoint: str) -> str:
    """`<stage or stepNNNN>-<hash>` for a checkpoint folder; `init-<hash of the name>` for a hub id."""
    p = Path(checkpoint).expanduser()
    if not p.is_dir():
        return "init-" + hashlib.sha256(checkpoint.encode()).hexdigest()[:10]
    from atomcli import checkpoint as ckpt
    h = hashlib.sha256()
    files = sorted({f for pattern in POLICY_FILES for f in p.glob(pattern) if f.is_file()})
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(p).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    state = ckpt.read_state(str(p))
    if state.get("stage") == "grpo-step":
        label = f"step{int(state.get('step') or 0):04d}"
    else:
        label = str(state.get("stage") or "init")
    return f"{label}-{h.hexdigest()[:10]}"


def _path_for_server(checkpoint: str) -> str:
    p = Path(checkpoint).expanduser()
    return str(p.resolve()) if p.exists() else checkpoint


# --- the server's HTTP side ----------------------------------------------------------------------

class Server:
    """The policy server of `openai:BASE_URL#MODEL`: its OpenAI routes under BASE_URL (…/v1), its
    native routes (SGLang's, vLLM's dev routes) at the root, i.e. BASE_URL without a trailing /v1."""

    def __init__(self, model_spec: str, *, timeout: float = SYNC_TIMEOUT, attempts: int = 3, backoff: float = 1.0):
        from atomcli.engines import openai as engine_openai
        url, self.model = engine_openai.parse_spec(model_spec)
        self.base_url = url[:-len("/completions")]
        self.root = self.base_url.removesuffix("/v1")
        self.timeout = timeout
        self.policy = retry.RetryPolicy(attempts=attempts, base=backoff, cap=max(8.0, backoff))
        self._key = os.environ.get("OPENAI_API_KEY") or None

    def post(self, url: str, obj: dict) -> bytes:
        """POST JSON; transient faults retried; a refusal raises `_Refused` with the server's message."""
        data = json.dumps(obj).encode()
        return self._call(lambda: openai_http.post_json(url, data, key=self._key, timeout=self.timeout,
                                                        max_bytes=MAX_RESPONSE_BYTES, what="policy server",
                                                        permanent_error=_Refused))

    def get(self, url: str) -> dict:
        raw = self._call(lambda: openai_http.get_json(url, key=self._key, timeout=self.timeout,
                                                      max_bytes=MAX_RESPONSE_BYTES, what="policy server",
                                                      permanent_error=_Refused))
        try:
            obj = json.loads(raw)
        except ValueError:
            raise _Refused(f"GET {url} did not answer JSON: {raw[:120]!r}") from None
        if not isinstance(obj, dict):
            raise _Refused(f"GET {url} answered {str(obj)[:120]}, not a JSON object")
        return obj

    def models(self) -> list[str]:
        """The model names `GET BASE_URL/models` lists (base model and loaded adapters)."""
        data = self.get(self.base_url + "/models").get("data")
        return [str(m.get("id")) for m in data if isinstance(m, dict)] if isinstance(data, list) else []

    def _call(self, fn):
        try:
            return self.policy.call(fn)
        except retry.ToolFault as e:
            raise PolicySyncError(openai_http.redact(f"policy server {self.root} failed after {self.policy.attempts} "
                                                     f"attempts: {e}", self._key)) from None


def _fail(method: str, what: str, error: Exception, hint: str) -> PolicySyncError:
    return PolicySyncError(f"policy sync `{method}`: {what}: {str(error)[:300]} (hint: {hint})")


# --- the methods ---------------------------------------------------------------------------------

class LoraVLLM:
    """vLLM's runtime LoRA endpoints: a new adapter name per version, the previous one unloaded."""
    name = "lora-vllm"
    HINT = ("start vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora --max-lora-rank R, "
            "and train with [grpo-step] lora = true")

    def __init__(self, server: Server, context=None, ledger: Path | None = None):
        self.server, self.context = server, context
        # adapters loaded and not yet unloaded, oldest first. With a ledger file (run-all's run folder)
        # the list outlives the process, so a resumed run unloads what the killed one left on the server;
        # only names from the ledger are unloaded, never another run's adapters on a shared server.
        self.ledger = ledger
        self.loaded: list[str] = _read_ledger(ledger)

    def sync(self, checkpoint: str, version: str) -> Served:
        from atomcli import checkpoint as ckpt
        adapter = ckpt.adapter_dir(checkpoint)
        if not adapter.is_dir():
            if checkpoint == self.server.model:  # the base the server was started with: nothing to load
                return self._verified(Served(self.server.model, version))
            raise InputError(f"checkpoint `{checkpoint}` has no LoRA adapter (adapter/) for lora-vllm to load",
                             hint="train with [grpo-step] lora = true, or sync full weights with sglang-disk, "
                                  "vllm-reload or command:CMD")
        name = ADAPTER_PREFIX + version
        try:
            self.server.post(self.server.base_url + "/load_lora_adapter",
                             {"lora_name": name, "lora_path": _path_for_server(str(adapter))})
        except _Refused as e:
            # already loaded (a resumed run, a retried sync) is fine; anything else is not
            if name not in self.server.models():
                raise _fail(self.name, f"loading adapter {name}", e, self.HINT) from None
        served = self._verified(Served(name, version))
        self._unload_older(name)
        return served

    def check(self, served: Served) -> str | None:
        names = self.server.models()
        if served.model in names:
            return None
        return f"`{served.model}` is not among its models ({', '.join(names[:6]) or 'none'})"

    def _verified(self, served: Served) -> Served:
        problem = self.check(served)
        if problem:
            raise PolicySyncError(f"policy sync `{self.name}`: after loading, the server does not serve it: "
                                  f"{problem} (hint: {self.HINT})")
        return served

    def _unload_older(self, keep: str) -> None:
        if keep not in self.loaded:
            self.loaded.append(keep)
            _write_ledger(self.ledger, self.loaded)
        for old in [n for n in self.loaded if n != keep]:
            try:
                self.server.post(self.server.base_url + "/unload_lora_adapter", {"lora_name": old})
            except _Refused:
                if old in self.server.models():  # still there: keep it listed, warn, try again next sync
                    self._warn(old, "the server refused")
                    continue
                # not loaded (the server restarted, or the unload happened before a kill): nothing to do
            except PolicySyncError as e:  # a leftover adapter costs memory, not correctness
                self._warn(old, str(e))
                continue
            self.loaded.remove(old)
            _write_ledger(self.ledger, self.loaded)

    def _warn(self, name: str, why: str) -> None:
        if self.context is not None:
            self.context.log(f"[yellow]warning:[/] could not unload LoRA adapter {name}: {why[:200]}")


def _read_ledger(path: Path | None) -> list[str]:
    if path is None or not path.is_file():
        return []
    try:
        names = json.loads(path.read_text()).get("loaded_adapters", [])
    except (ValueError, AttributeError):
        return []  # a torn or foreign file: forget it (the worst case is an adapter left loaded)
    return [n for n in names if isinstance(n, str) and n.startswith(ADAPTER_PREFIX)]


def _write_ledger(path: Path | None, names: list[str]) -> None:
    if path is not None:  # atomic: a kill leaves the old list or the new one
        from atomcli.tableio import write_bytes_atomic
        write_bytes_atomic(path, json.dumps({"loaded_adapters": names}).encode())


class SGLangDisk:
    """SGLang's update-from-disk, tagged with the version, checked through /model_info."""
    name = "sglang-disk"
    HINT = "the checkpoint folder must be readable by the SGLang server at the same path"

    def __init__(self, server: Server, context=None):
        self.server, self.context = server, context

    def sync(self, checkpoint: str, version: str) -> Served:
        path = _path_for_server(checkpoint)
        try:
            raw = self.server.post(self.server.root + "/update_weights_from_disk",
                                   {"model_path": path, "weight_version": version})
        except _Refused as e:
            raise _fail(self.name, f"update_weights_from_disk {path}", e, self.HINT) from None
        try:
            ok = json.loads(raw).get("success")
        except (ValueError, AttributeError):
            ok = None
        if ok is False or (isinstance(ok, str) and ok.lower() == "false"):
            raise PolicySyncError(f"policy sync `{self.name}`: update_weights_from_disk {path} failed: "
                                  f"{raw[:300]!r} (hint: {self.HINT})")
        served = Served(self.server.model, version)
        problem = self._check(served, path)
        if problem:
            raise PolicySyncError(f"policy sync `{self.name}`: after the update the server reports {problem}")
        return served

    def check(self, served: Served) -> str | None:
        return self._check(served, None)

    def _check(self, served: Served, path: str | None) -> str | None:
        info = self._model_info()
        have = info.get("weight_version")
        if have is not None and str(have) != served.version:
            return f"weight_version `{have}`, not `{served.version}`"
        if have is None and path is None:
            return "no weight_version (an SGLang without weight versions cannot be checked; upgrade it)"
        if path is not None and info.get("model_path") not in (None, path):
            return f"model_path `{info.get('model_path')}`, not `{path}`"
        return None

    def _model_info(self) -> dict:
        try:
            return self.server.get(self.server.root + "/model_info")
        except _Refused:
            try:  # releases before /model_info have only the older name
                return self.server.get(self.server.root + "/get_model_info")
            except _Refused as e:
                raise _fail(self.name, "reading /model_info", e, "is this an SGLang server?") from None


class VLLMReload:
    """vLLM's reload_weights through the dev-mode /collective_rpc, labelled and checked via /weight_info."""
    name = "vllm-reload"
    HINT = "start vLLM with VLLM_SERVER_DEV_MODE=1 (a release with /weight_info, vLLM PR #49040 or later)"

    def __init__(self, server: Server, context=None):
        self.server, self.context = server, context

    def sync(self, checkpoint: str, version: str) -> Served:
        path = _path_for_server(checkpoint)
        steps = (("reload_weights", "/collective_rpc",
                  {"method": "reload_weights", "kwargs": {"weights_path": path, "is_checkpoint_format": True}}),
                 ("update_weight_version", "/update_weight_version", {"new_version": version}))
        for what, route, body in steps:
            try:
                self.server.post(self.server.root + route, body)
            except _Refused as e:
                raise _fail(self.name, f"{what} ({path})", e, self.HINT) from None
        served = Served(self.server.model, version)
        problem = self.check(served)
        if problem:
            raise PolicySyncError(f"policy sync `{self.name}`: after the reload the server reports {problem}")
        return served

    def check(self, served: Served) -> str | None:
        try:
            have = self.server.get(self.server.root + "/weight_info").get("weight_version")
        except _Refused as e:
            raise _fail(self.name, "reading /weight_info", e, self.HINT) from None
        return None if str(have) == served.version else f"weight_version `{have}`, not `{served.version}`"


class TransformersServe:
    """`transformers serve`: each checkpoint loaded and asked for by its own path."""
    name = "transformers-serve"
    HINT = "run `transformers serve` where the checkpoint folder is readable at the same path"

    def __init__(self, server: Server, context=None):
        self.server, self.context = server, context

    def sync(self, checkpoint: str, version: str) -> Served:
        path = _path_for_server(checkpoint)
        if not Path(path).is_dir():
            raise InputError(f"policy sync `{self.name}` serves checkpoint folders; `{checkpoint}` is not one",
                             hint="start from a local model folder: openai:BASE_URL#/path/to/model")
        try:
            raw = self.server.post(self.server.root + "/load_model", {"model": path})
        except _Refused as e:
            raise _fail(self.name, f"load_model {path}", e, self.HINT) from None
        last = {}  # the last server-sent event, `data: {"status": ...}`
        for line in raw.decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                last = json.loads(line[5:]) if line.startswith("data:") else last
        last = last if isinstance(last, dict) else {}
        if last.get("status") != "ready":
            raise PolicySyncError(f"policy sync `{self.name}`: load_model {path} did not end ready: "
                                  f"{str(last.get('message') or raw[-300:])[:300]} (hint: {self.HINT})")
        served = Served(path, version)
        problem = self.check(served)
        if problem:
            raise PolicySyncError(f"policy sync `{self.name}`: after loading, the server {problem}")
        return served

    def check(self, served: Served) -> str | None:
        now = policy_version(served.model)
        if now != served.version:
            return f"may hold older weights: the files at `{served.model}` are now version {now}"
        names = self.server.models()
        return None if served.model in names else \
            f"has not loaded `{served.model}` ({', '.join(names[:4]) or 'no local model loaded'})"


class Command:
    """The user's own command; its exit code (and an optional served_model= line) is the evidence."""
    name = "command"

    def __init__(self, spec: str, server: Server, context=None, *, attempts: int = 3, backoff: float = 2.0,
                 timeout: float = COMMAND_TIMEOUT):
        self.spec, self.argv = spec, _command_argv(spec)
        self.server, self.context, self.timeout = server, context, timeout
        self.policy = retry.RetryPolicy(attempts=attempts, base=backoff, cap=max(30.0, backoff))

    def sync(self, checkpoint: str, version: str) -> Served:
        path = _path_for_server(checkpoint)
        env = {**os.environ, "ATOM_POLICY_CHECKPOINT": path, "ATOM_POLICY_VERSION": version,
               "ATOM_POLICY_SERVER": self.server.base_url, "ATOM_POLICY_MODEL": self.server.model}
        try:
            out = self.policy.call(self._run, [*self.argv, path, version], env)
        except retry.ToolFault as e:
            raise PolicySyncError(f"policy sync command `{shlex.join(self.argv)}` failed after "
                                  f"{self.policy.attempts} attempts: {e}") from None
        model = self.server.model
        for line in out.splitlines():
            if line.strip().startswith(SERVED_MODEL_LINE):
                model = line.strip()[len(SERVED_MODEL_LINE):].strip() or model
        served = Served(model, version)
        problem = self.check(served)
        if problem:
            raise PolicySyncError(f"policy sync command `{shlex.join(self.argv)}` exited 0, but the server {problem}")
        return served

    def check(self, served: Served) -> str | None:
        names = self.server.models()
        return None if served.model in names else \
            f"does not list `{served.model}` among its models ({', '.join(names[:6]) or 'none'})"

    def _run(self, argv: list[str], env: dict) -> str:
        try:
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=self.timeout, check=False)
        except FileNotFoundError:
            raise InputError(f"policy sync command `{argv[0]}` not found",
                             hint="give an executable on PATH or its full path: command:/path/to/sync.sh") from None
        except subprocess.TimeoutExpired:
            raise retry.ToolFault(f"timed out after {self.timeout:g} s") from None
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or [""])[-1]
            raise retry.ToolFault(f"exited {proc.returncode}" + (f": {last[:200]}" if last else ""))
        return proc.stdout


def _command_argv(spec: str) -> list[str]:
    try:
        argv = shlex.split(spec[len(COMMAND_PREFIX):])
    except ValueError as e:
        raise InputError(f"policy sync `{spec}`: {e}", hint='command:"sync.sh --flag" (shell quoting)') from None
    if not argv:
        raise InputError("policy sync `command:` names no command", hint="command:/path/to/sync.sh")
    return argv


def make(spec: str, model_spec: str, context=None, state_dir: Path | None = None) -> SyncMethod:
    """The sync method `spec` for the server of `model_spec` (`openai:BASE_URL#MODEL`).
    state_dir: where a method keeps what must outlive the process (run-all's run folder)."""
    check_spec(spec)
    server = Server(model_spec)
    if spec.startswith(COMMAND_PREFIX):
        return Command(spec, server, context)
    if spec == "lora-vllm":
        return LoraVLLM(server, context, ledger=state_dir / LEDGER if state_dir is not None else None)
    return {"sglang-disk": SGLangDisk, "vllm-reload": VLLMReload,
            "transformers-serve": TransformersServe}[spec](server, context)


# --- the rollout's check ---------------------------------------------------------------------------

def check_config(model: str, sync: str, version: str) -> None:
    """The rollout's settings agree: a version to check needs an `openai:` policy and a sync method."""
    if sync:
        check_spec(sync)
    if not version:
        return
    if not model.startswith("openai:"):
        raise InputError("--policy-version applies only to a served policy (--model openai:BASE_URL#MODEL)")
    if not sync:
        raise InputError("--policy-version needs --policy-sync: the method says how to ask the server which "
                         "policy it serves", hint="e.g. --policy-sync sglang-disk")


def check_rollout(model: str, sync: str, version: str, context=None) -> None:
    """Refuse (InputError, exit 2) to roll out when the server does not serve policy `version`."""
    check_config(model, sync, version)
    if not version:
        return
    method = make(sync, model, context)
    from atomcli.engines import openai as engine_openai
    served = Served(engine_openai.parse_spec(model)[1], version)
    try:
        problem = method.check(served)
    except _Refused as e:  # it refuses to say (a down server, past its retries, is a runtime failure)
        problem = str(e)
    if problem:
        raise InputError(f"stale policy server: expected policy {version}, but {problem}",
                         hint="sync the server first (run-all does after every step), or pass the "
                              "--policy-version it serves")


# --- run-all's side --------------------------------------------------------------------------------

class Follower:
    """Keeps a served policy in step with run-all's trainer: before each rollout the server is made to
    serve the checkpoint the rollout is for (`rollout_config`), once per checkpoint."""

    def __init__(self, model_spec: str, sync: str, context, state_dir: Path | None = None):
        self.spec, self.sync_spec, self.context = model_spec, sync, context
        self.method = make(sync, model_spec, context, state_dir)
        self.base_url = Server(model_spec).base_url
        self.current: tuple[str, Served] | None = None  # (checkpoint, what the server serves for it)
        self.synced: list[tuple[str, Served]] = []  # every sync of this process, in order

    @classmethod
    def for_run(cls, model: str, sync: str, *, lora: bool, sft: bool, context,
                state_dir: Path | None = None) -> Follower | None:
        """run-all's follower, or None for an in-process policy; every setting is checked here, at start.
        state_dir: the run folder (a resumed run finds there what the killed one left on the server)."""
        if not model.startswith("openai:"):
            if sync:
                raise InputError(f"policy_sync `{sync}` applies only to a served policy",
                                 hint="set [run-all] model = \"openai:BASE_URL#MODEL\", or drop policy_sync")
            return None
        if not sync:
            raise InputError("a served policy (openai:) needs [run-all] policy_sync: a server that never "
                             "receives the new weights would sample the starting policy at every step",
                             hint="policy_sync = lora-vllm, sglang-disk, vllm-reload, transformers-serve or "
                                  "command:CMD (see atomcli/engines/policy_sync.py)")
        check_spec(sync)
        if sync == "lora-vllm" and not lora:
            raise InputError("policy_sync lora-vllm loads LoRA adapters: the trainer must write them",
                             hint="set [grpo-step] lora = true, or sync full weights with sglang-disk")
        if sync == "lora-vllm" and sft:
            raise InputError("policy_sync lora-vllm cannot serve an SFT checkpoint (full weights: sft_data or "
                             "rft_rounds)",
                             hint="serve the SFT model and start run-all from it without sft_data and rft_rounds, "
                                  "or use sglang-disk / vllm-reload")
        return cls(model, sync, context, state_dir)

    def rollout_config(self, cfg):
        """`cfg` (a RolloutConfig whose model is the local checkpoint to roll out) for the served policy:
        the server synced to that checkpoint if it is not already, model/tokenizer/version set."""
        checkpoint = cfg.model
        if self.current is None or self.current[0] != checkpoint:
            version = policy_version(checkpoint)
            t0 = time.time()
            served = self.method.sync(checkpoint, version)
            self.current = (checkpoint, served)
            self.synced.append(self.current)
            self.context.log(f"policy sync ({self.method.name}): {version} served as `{served.model}` "
                             f"({time.time() - t0:.1f} s)")
        served = self.current[1]
        return dataclasses.replace(cfg, model=f"openai:{self.base_url}#{served.model}",
                                   tokenizer=cfg.tokenizer or checkpoint, policy_sync=self.sync_spec,
                                   policy_version=served.version)
