"""Stage `rollout`: the multi-turn atomic-thought agent (docs/design.md, "The agent format"), G samples per question.

Owns the rollout columns of the trajectory table, including the exact token columns
(`prompt_ids`, `completion_ids`, `loss_mask`, `old_logprobs`) built incrementally from what
the policy sampled and what the environment inserted.

How the token columns are built (and why they can be trusted):

- `prompt_ids` = the tokenized chat rendering of [system, user] with the generation prompt.
- Each assistant turn appends the ids the engine *sampled* (mask 1, their log-prob under
  the raw model logits at temperature 1), never a re-tokenization of the text. The turn's
  message content is exactly the text those ids decode to; when the turn ended with an
  end-of-sequence token that the chat template writes as its own turn end (ChatML's
  `<|im_end|>`), the token stays in the ids (the policy chose to end its turn) and its text
  is left out of the content, where the template puts it back.
- Everything the environment adds (the rest of the template's turn closing, the tool
  message, the next generation prompt) is *glue*: mask 0, log-prob 0.0. Glue is the text
  difference between chat renderings of the conversation before and after the new
  messages, tokenized on its own. So decoding `prompt_ids + completion_ids` gives exactly
  `apply_chat_template(messages)`, whatever the sampled text would re-tokenize to.
- That needs an append-only chat template (each rendering extends the previous one). It is
  probed before anything runs; a template that rewrites earlier turns (e.g. one that drops
  old `<think>` blocks) is refused with a clear message.

Episode rules: generation stops at `</tool_call>`, `</answer>`, an end-of-sequence token or
the per-turn cap. An answer ends the episode (`answer`). A tool call runs (all calls of a turn
run concurrently across the batch); a malformed call, or a turn with neither call nor answer,
gets an error observation the model can recover from and is recorded in `tool_calls`.
After `max_turns` turns without an answer the episode ends (`max_turns`; that last turn's call
is not run). With `--last-turn-note` the tool response before the last turn ends with
`agent.format.LAST_TURN_NOTE` (this turn must answer): the cap is then a rule the policy can
read, not one it discovers only by being cut off. With `--force-answer` a last turn that still
calls a tool is followed by one more turn that the environment opens with the answer begun
(`agent.format.forced_answer_head`, the same head `score-ig` teacher-forces); the policy
writes the answer and the episode ends with `forced_answer` (scored like any answer), or with
`max_turns` when that turn does not close the answer. When the context cap leaves no room for another turn, or the cap cuts a turn,
it ends with `length`; an engine failure for one trajectory ends it with `error`.

Served policies: with `--policy-version V` (and `--policy-sync M`, the method that says how to ask
the server; run-all sets both after each sync) the server is first asked whether it serves V, and a
stale one is refused before anything is sampled; every row records V in `policy_version`
(atomcli/engines/policy_sync.py).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import pyarrow as pa

from atomcli import plugins, schema
from atomcli.agent import format as agent_format
from atomcli.agent.episode import Agent, Chat, Episode, Sampling
from atomcli.config import opt
from atomcli.engines.base import Engine
from atomcli.errors import InputError, unknown_choice

# --precision: the torch dtype the HF engine's copy of the policy has
SAMPLING_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


@dataclass
class RolloutConfig:
    model: str = opt("smollm2", "policy: `smollm2`, a checkpoint folder, or openai:BASE_URL#MODEL")
    search: str = opt("ddg", "search backend SPEC: local:INDEX, ddg, replay:CACHE")
    search_options: str = opt("", "options for the search backend, KEY=VALUE,... (e.g. region=de-de,rate=1 for ddg)")
    group_size: int = opt(4, "samples per question (the GRPO group)")
    max_turns: int = opt(10, "assistant turns before the episode ends with finish_reason=max_turns")
    last_turn_note: bool = opt(False, "tell the agent its budget: the tool response before its last turn (the "
                                      "question, with --max-turns 1) ends with a note that this turn must answer",
                               advanced=True)
    force_answer: bool = opt(False, "a last turn that still calls a tool does not end the episode unanswered: the "
                                    "call is not run, the environment says so (with the last-turn note) and opens "
                                    "one more turn with <think>...</think><answer> written, and the policy writes "
                                    "the answer (finish_reason forced_answer)", advanced=True)
    max_new_tokens: int = opt(512, "token cap per assistant turn")
    max_context: int = opt(8192, "token cap for the whole trajectory", advanced=True)
    temperature: float = opt(1.0, "sampling temperature (0 = greedy)")
    top_p: float = opt(1.0, "nucleus sampling", advanced=True)
    seed: int = opt(0, "random seed: same seed, same output")
    batch_size: int = opt(16, "rows sampled together (the in-process engine keeps twice as many trajectories "
                              "going and gives a finished row's place to the next at once; openai engine: requests "
                              "per turn, --concurrency of them in flight)", advanced=True)
    k: int = opt(10, "search results per query", advanced=True)
    cache: str = opt("", "SQLite cache file for searches and pages")
    replay: bool = opt(False, "serve tools only from --cache (a recorded environment)", advanced=True)
    reader: str = opt("bm25", "browse reader: bm25, policy, or a judge SPEC", advanced=True)
    allow_hosts: str = opt("", "comma-separated hosts/IPs the SSRF guard lets through (e.g. 127.0.0.1)", advanced=True)
    date: str = opt("", "date stated in the system prompt (YYYY-MM-DD; default today)", advanced=True)
    system_prompt: str = opt("", "system prompt text replacing the built-in one ({date} and {tools} are filled in)",
                             advanced=True)
    limit: int = opt(0, "use only the first N questions (0 = all)")
    shard: str = opt("", "i/n: process every n-th group starting at i (split a question set across machines)",
                     advanced=True)
    concurrency: int = opt(8, "parallel requests for the OpenAI engine and parallel tool calls", advanced=True)
    timeout: float = opt(120.0, "seconds per request for the OpenAI engine", advanced=True)
    trust_remote_code: bool = opt(False, "allow model code from the checkpoint to run", advanced=True)
    device: str = opt("", "HF engine: torch device for the policy (cpu, cuda, cuda:1; default: where it loads)",
                      advanced=True)
    tokenizer: str = opt("", "OpenAI engine: local tokenizer of the served model (folder, hub id or smollm2; "
                             "default: the model name after #)", advanced=True)
    prompt_ids: bool = opt(True, "OpenAI engine: send prompts as token ids (exact; vLLM, SGLang) rather than text",
                           advanced=True)
    retries: int = opt(4, "OpenAI engine: attempts per request on timeouts, 429 and 5xx", advanced=True)
    precision: str = opt("fp32", "HF engine: the weights the policy samples with: fp32, or bf16 (a bfloat16 copy of "
                                 "the policy: faster on CPUs with AMX and on GPUs; the sampled log-probs then "
                                 "differ slightly from an fp32 pass; bench/RESULTS.md)", advanced=True)
    reuse_kv: bool = opt(True, "HF engine: keep each trajectory's KV cache between turns and compute shared "
                               "prompt prefixes once (same tokens, much less prefill)", advanced=True)
    policy_sync: str = opt("", "OpenAI engine: how the server is brought to a new policy (lora-vllm, sglang-disk, "
                               "vllm-reload, command:CMD; atomcli/engines/policy_sync.py); with --policy-version, "
                               "how the server is asked which policy it serves", advanced=True)
    policy_version: str = opt("", "OpenAI engine: the policy version the server must serve (run-all sets it after "
                                  "each sync); recorded per row, and a server serving another is refused",
                              advanced=True)


# --- groups, shards, seeds ------------------------------------------------------------------

def group_ids(table) -> list[str]:
    """One group id per question row: its `id`, made unique (`id~2`, `id~3`…) when ids repeat."""
    seen: dict[str, int] = {}
    out = []
    for raw in table.column("id").to_pylist():
        gid = str(raw)
        n = seen.get(gid, 0) + 1
        seen[gid] = n
        out.append(gid if n == 1 else f"{gid}~{n}")
    # a later `x~2` could collide with a real id `x~2`: add more suffix until unique
    used: set[str] = set()
    for i, gid in enumerate(out):
        while gid in used:
            gid += "~"
        used.add(gid)
        out[i] = gid
    return out


def parse_shard(shard: str) -> tuple[int, int]:
    if not shard:
        return 0, 1
    try:
        i, n = (int(x) for x in shard.split("/"))
    except ValueError:
        raise InputError(f"--shard `{shard}` is not i/n", hint="e.g. --shard 0/4 ... --shard 3/4") from None
    if n < 1 or not 0 <= i < n:
        raise InputError(f"--shard `{shard}`: need 0 <= i < n", hint="e.g. --shard 0/4 ... --shard 3/4")
    return i, n


def selected_rows(table, config: RolloutConfig) -> list[int]:
    """Question rows this run covers: the first `limit`, then every n-th from i (`shard`)."""
    n_rows = table.num_rows if config.limit <= 0 else min(config.limit, table.num_rows)
    i, n = parse_shard(config.shard)
    return list(range(i, n_rows, n))


def validate(config: RolloutConfig) -> None:
    checks = [
        (config.group_size >= 1, "--group-size must be >= 1"),
        (config.max_turns >= 1, "--max-turns must be >= 1"),
        (config.max_new_tokens >= 1, "--max-new-tokens must be >= 1"),
        (config.max_context >= 2, "--max-context must be >= 2"),
        (config.temperature >= 0, "--temperature must be >= 0 (0 = greedy)"),
        (0 < config.top_p <= 1, "--top-p must be in (0, 1]"),
        (config.batch_size >= 1, "--batch-size must be >= 1"),
        (config.limit >= 0, "--limit must be >= 0"),
        (config.concurrency >= 1, "--concurrency must be >= 1"),
        (config.timeout > 0, "--timeout must be > 0"),
    ]
    for ok, msg in checks:
        if not ok:
            raise InputError(msg)
    if config.precision not in SAMPLING_DTYPES:
        raise unknown_choice("--precision", config.precision, tuple(SAMPLING_DTYPES))
    parse_shard(config.shard)
    from atomcli.engines import policy_sync
    policy_sync.check_config(config.model, config.policy_sync, config.policy_version)


# --- engines --------------------------------------------------------------------------------

def engine_for(config: RolloutConfig, context) -> Engine:
    """The sampling engine for `config.model`, cached in the context (run-all loads it once)."""
    if config.model.startswith("openai:"):
        from atomcli.engines import openai as engine_openai
        key = ("rollout-engine", config.model, config.tokenizer, config.prompt_ids, config.concurrency,
               config.timeout, config.retries)
        return context.cached(key, lambda: engine_openai.make(config, context))
    from atomcli.engines.hf import HFEngine
    # only non-default options go into the key, so run-all's other stages share the loaded model
    kw = {"trust_remote_code": True} if config.trust_remote_code else {}
    if config.device:
        kw["device"] = config.device
    if config.precision != "fp32":
        kw["dtype"] = SAMPLING_DTYPES[config.precision]
    model, tok = context.model(config.model, **kw)
    return HFEngine(config.model, model, tok, batch_size=config.batch_size, reuse_kv=config.reuse_kv)


def provenance_fields(config: RolloutConfig, context) -> dict:
    """`model`, `tokenizer` and `extra` for the rollout's provenance record."""
    from atomcli import models
    engine = engine_for(config, context)
    return {"model": config.model, "tokenizer": models.tokenizer_id(engine.tokenizer),
            "extra": engine.provenance()}


# --- the stage ------------------------------------------------------------------------------

def run(table, config: RolloutConfig, context, *, done_groups=frozenset(), sink=None):
    """Roll out G trajectories per selected question; returns the new rows (input columns kept).

    `done_groups`: group ids to skip (resume). `sink(table)`: called with each group's rows as
    soon as the group is complete, so that an interrupted run keeps its finished groups."""
    from atomcli.env.tools import ToolBox

    validate(config)
    gids = group_ids(table)
    rows = [r for r in selected_rows(table, config) if gids[r] not in done_groups]
    if not rows:
        return rows_table(table, [], config)
    questions = table.column("question").to_pylist()
    engine_box: list = []
    reader_fn = (lambda prompts: engine_box[0].complete(prompts)) if config.reader == "policy" else None
    # the toolbox first: a bad index or cache fails before the model loads
    toolbox = ToolBox(config.search, context, k=config.k, cache=config.cache, replay=config.replay,
                      reader=config.reader, allow_hosts=config.allow_hosts, concurrency=config.concurrency,
                      reader_fn=reader_fn, search_options=plugins.parse_options(config.search_options))
    try:
        if config.policy_version:  # a stale server is refused before anything is sampled from it
            from atomcli.engines import policy_sync
            policy_sync.check_rollout(config.model, config.policy_sync, config.policy_version, context)
        engine = engine_for(config, context)
        engine_box.append(engine)
        system = agent_format.system_prompt(config.date, config.system_prompt)
        chat = Chat(engine.tokenizer)
        chat.check(system)
        max_ctx = config.max_context
        if engine.max_positions:
            max_ctx = min(max_ctx, engine.max_positions)
        agent = Agent(Sampling(config.max_new_tokens, config.max_turns, config.seed, config.temperature,
                               config.top_p, config.last_turn_note, config.force_answer), chat, system, max_ctx)
        episodes = [Episode(r, gids[r], s) for r in rows for s in range(config.group_size)]
        with Monitor(context, len(rows), len(episodes)) as monitor:
            _loop(agent, engine, toolbox, episodes, questions, config, monitor, table, sink)
            if agent.template_faults:
                context.log(f"[yellow]warning:[/] {agent.template_faults} trajectories ended with `error`: "
                            "the chat template re-rendered an earlier turn")
        errors = [ep for ep in episodes if ep.error]
        if errors:
            context.log(f"[yellow]warning:[/] {len(errors)} trajectories ended with `error`; first: "
                        f"{errors[0].traj_id}: {errors[0].error}")
        result = rows_table(table, episodes, config)
        monitor.summary(result)
        return result
    finally:
        toolbox.close()


def _loop(agent: Agent, engine, toolbox, episodes, questions, config, monitor, table, sink) -> None:
    pending = deque(episodes)
    left = {}
    for ep in episodes:
        left[ep.group_id] = left.get(ep.group_id, 0) + 1
    by_group: dict[str, list[Episode]] = {}
    active: list[Episode] = []

    def done(ep: Episode) -> None:
        toolbox.forget(ep.traj_id)  # the browse reader's memory of this trajectory
        engine.release(ep.traj_id)  # and the engine's KV cache of it
        by_group.setdefault(ep.group_id, []).append(ep)
        left[ep.group_id] -= 1
        monitor.trajectory_done(ep)
        if left[ep.group_id] == 0:
            group = sorted(by_group.pop(ep.group_id), key=lambda e: e.sample_idx)
            if sink is not None:
                sink(rows_table(table, group, config))
            monitor.group_done()

    while pending or active:
        # an engine that refills its rows within a turn (HFEngine) is handed more trajectories than it has rows,
        # so the rows stay busy while the turn's longest replies finish
        while pending and len(active) < config.batch_size * engine.pool_factor:
            ep = pending.popleft()
            agent.start(ep, questions[ep.row])
            if ep.finish_reason:
                done(ep)
            else:
                active.append(ep)
        if not active:
            continue
        reqs = [agent.request(ep) for ep in active]
        t0 = time.time()
        results = engine.generate(reqs)
        monitor.sampled(sum(len(r.ids) for r in results), time.time() - t0)
        for ep, req, res in zip(active, reqs, results):
            agent.absorb(ep, res, req.max_new_tokens)
        calls = [ep for ep in active if ep.pending is not None]
        if calls:
            outs = toolbox.run_many([(ep.pending, ep.traj_id) for ep in calls])
            for ep, out in zip(calls, outs):
                monitor.tool(out)
                agent.observe(ep, ep.pending, out)
        still = []
        for ep in active:
            (done if ep.finish_reason else still.append)(ep)
        active = still


def rows_table(table, episodes: list[Episode], config: RolloutConfig):
    """The input rows (repeated per sample) with the rollout columns set."""
    sub = table.take(pa.array([ep.row for ep in episodes], type=pa.int64()))
    search = {"web_search": "n_search", "browse_webpage": "n_browse"}
    counts = [{v: sum(1 for c in ep.tool_calls if c["name"] == k) for k, v in search.items()} for ep in episodes]
    values = {
        "traj_id": [ep.traj_id for ep in episodes],
        "group_id": [ep.group_id for ep in episodes],
        "sample_idx": [ep.sample_idx for ep in episodes],
        "policy": [config.model] * len(episodes),
        "policy_version": [config.policy_version or None] * len(episodes),
        "messages": [ep.messages for ep in episodes],
        "answer": [ep.answer for ep in episodes],
        "finish_reason": [ep.finish_reason for ep in episodes],
        "format_ok": [agent_format.trajectory_format_ok(ep.messages) for ep in episodes],
        "n_turns": [ep.n_turns for ep in episodes],
        "n_search": [c["n_search"] for c in counts],
        "n_browse": [c["n_browse"] for c in counts],
        "tool_calls": [ep.tool_calls for ep in episodes],
        "prompt_ids": [ep.prompt_ids for ep in episodes],
        "completion_ids": [ep.completion_ids for ep in episodes],
        "loss_mask": [ep.loss_mask for ep in episodes],
        "old_logprobs": [ep.old_logprobs for ep in episodes],
    }
    return schema.set_columns(sub, values)


# --- progress and summary (stderr) ----------------------------------------------------------

class Monitor:
    """Progress (groups done of all, ETA, trajectories, tokens/s, tool calls/s, errors: atomcli.progress)
    and the closing summary."""

    def __init__(self, context, n_groups: int, n_traj: int):
        from atomcli.progress import Progress
        self.context, self.n_groups, self.n_traj = context, n_groups, n_traj
        self.t0 = time.time()
        self.tokens = self.gen_seconds = 0.0
        self.tool_calls = self.tool_errors = self.groups = self.failed = self.trajectories = 0
        self.progress = Progress(context, "rollout", n_groups, "groups")

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def _refresh(self):
        dt = max(time.time() - self.t0, 1e-9)
        stats = (f"{self.trajectories}/{self.n_traj} trajectories  {self.tokens / dt:.0f} tok/s  "
                 f"{self.tool_calls / dt:.1f} calls/s  errors: {self.tool_errors} tool, {self.failed} trajectories")
        self.progress.update(completed=self.groups, info=stats)

    def sampled(self, n: int, seconds: float):
        self.tokens += n
        self.gen_seconds += seconds
        self._refresh()

    def tool(self, result):
        self.tool_calls += 1
        self.tool_errors += 0 if result.ok else 1
        self._refresh()

    def trajectory_done(self, ep):
        self.failed += ep.finish_reason == "error"
        self.trajectories += 1

    def group_done(self):
        self.groups += 1
        self._refresh()

    def summary(self, result):
        if self.context.quiet or result.num_rows == 0:
            return
        from rich.table import Table
        wall = time.time() - self.t0
        reasons: dict[str, int] = {}
        for r in result.column("finish_reason").to_pylist():
            reasons[r] = reasons.get(r, 0) + 1
        n = result.num_rows
        fmt = sum(result.column("format_ok").to_pylist())
        turns = sum(result.column("n_turns").to_pylist()) / n
        t = Table(title="rollout", show_header=False, title_justify="left")
        t.add_column(style="bold")
        t.add_column(justify="right")
        for k, v in [("groups / trajectories", f"{self.groups} / {n}"),
                     ("finish", ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()))),
                     ("format ok", f"{fmt / n:.0%}"), ("turns per trajectory", f"{turns:.2f}"),
                     ("searches / browses", f"{sum(result.column('n_search').to_pylist())} / "
                                            f"{sum(result.column('n_browse').to_pylist())}"),
                     ("tool errors", f"{self.tool_errors} of {self.tool_calls}"),
                     ("tokens sampled", f"{self.tokens:.0f} ({self.tokens / max(self.gen_seconds, 1e-9):.1f}/s "
                                        "while sampling)"),
                     ("wall time", f"{wall:.1f} s")]:
            t.add_row(k, v)
        self.context.console.print(t)
