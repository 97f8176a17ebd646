"""The habits users expect: shell completion, hf-style help, progress in every long stage (also
when stderr is a log file), JSON Lines from `atom search`/`atom browse`, checkpoints other tools load."""

from __future__ import annotations

import io
import json
import re
import time

import pytest
import torch
from conftest import ROOT, atom
from rich.console import Console

from atomcli import checkpoint, models, plugins, progress
from atomcli.context import Context

ENV = {"COLUMNS": "200"}


def log_context(width: int = 200) -> tuple[Context, io.StringIO]:
    """A context whose stderr is a file (not a terminal), as under cron or `2> log`."""
    buf = io.StringIO()
    return Context(console=Console(file=buf, width=width, highlight=False)), buf


# --- 1. shell completion ---------------------------------------------------------------------------

def test_show_completion_prints_a_completion_script_and_completion_works():
    # name the shell: typer otherwise detects it from the parent processes, and a test run with no
    # shell among its ancestors (a detached job) gets "Shell  not supported"
    proc = atom("--show-completion", "bash", env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}, check=True)
    script = proc.stdout.decode()
    assert "_atom_completion" in script and "_ATOM_COMPLETE" in script and "complete " in script
    proc = atom(env={"_ATOM_COMPLETE": "complete_bash", "COMP_WORDS": "atom ro", "COMP_CWORD": "1"})
    assert proc.stdout.decode().split() == ["rollout"]
    proc = atom(env={"_ATOM_COMPLETE": "complete_bash", "COMP_WORDS": "atom rollout --group", "COMP_CWORD": "2"})
    assert proc.stdout.decode().split() == ["--group-size"]
    assert "--install-completion" in atom("--help", env=ENV, check=True).stdout.decode()


def test_readme_shows_the_completion_install_line():
    assert "atom --install-completion" in (ROOT / "README.md").read_text()


# --- 6. help text ----------------------------------------------------------------------------------

def test_stage_help_reads_like_the_hf_cli():
    text = atom("rollout", "--help", env=ENV, check=True).stdout.decode()
    assert text.startswith("Usage: atom rollout [OPTIONS] QUESTIONS\n")
    assert "{" not in text.splitlines()[0] and "<bool>" not in text and "<str>" not in text and "<int>" not in text
    assert "╭" not in text  # plain sections, as `hf` prints them
    assert re.search(r"^Arguments:\n  QUESTIONS +FlashRAG questions", text, re.M)
    assert re.search(r"^  --resume +Skip groups", text, re.M)  # a flag: nothing after it
    assert "--replay" not in text and re.search(r"more options .* docs/config\.md", text, re.S)  # advanced: hidden
    assert re.search(r"^  --group-size INTEGER +samples per question .*\[default: 4\]", text, re.M)
    assert re.search(r"^  --temperature FLOAT ", text, re.M) and re.search(r"^  -o, --out TEXT ", text, re.M)
    assert "[rollout] section" in text and "\\[" not in text
    assert "[default: ]" not in text  # an empty default is no default
    sft = atom("sft", "--help", env=ENV, check=True).stdout.decode()
    assert re.search(r"^  --lora / --no-lora +train a LoRA adapter .*\[default: --no-lora\]", sft, re.M)


def test_root_help_lists_commands_and_usage_lines_name_arguments():
    text = atom("--help", env=ENV, check=True).stdout.decode()
    assert text.startswith("Usage: atom [OPTIONS] COMMAND [ARGS]...")
    assert re.search(r"^Commands:\n  sft ", text, re.M) and "  run-all " in text and "<bool>" not in text
    for cmd, usage in (("score-rrm", "INPUT"), ("sft", "DATA"), ("search", "QUERY"), ("browse", "URL"),
                       ("show", "TABLE"), ("index", "CORPUS")):
        first = atom(cmd, "--help", env=ENV, check=True).stdout.decode().splitlines()[0]
        assert first == f"Usage: atom {cmd} [OPTIONS] {usage}", first
    run_all = atom("run-all", "--help", env=ENV, check=True).stdout.decode()
    assert re.search(r"^  --preset TEXT +A canned run", run_all, re.M)
    assert "N x [rollout -> score-rrm" in run_all


# --- 2. progress ------------------------------------------------------------------------------------

def test_progress_lines_when_stderr_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(progress, "EVERY", 0.02)
    ctx, buf = log_context()
    with progress.Progress(ctx, "work", 4, "items") as p:
        for _ in range(4):
            time.sleep(0.06)
            p.advance(info="x 1")
    lines = buf.getvalue().splitlines()
    assert len(lines) >= 3
    assert re.fullmatch(r"work: [0-4]/4 items \(\d+%\), elapsed 0:00, ETA (\d+:\d\d|\?) \| x 1|"
                        r"work: 0/4 items \(0%\), elapsed 0:00, ETA \?", lines[0]), lines[0]
    assert re.fullmatch(r"work: 4/4 items \(100%\), done in 0:00 \| x 1", lines[-1]), lines[-1]


def test_a_run_that_lasted_a_period_gets_its_closing_line_even_if_no_tick_was_printed(monkeypatch):
    """A once-flaky CI test: on a loaded machine the timer thread may not print a tick within a short run."""
    monkeypatch.setattr(progress.Progress, "_tick", lambda self: self._stop.wait())  # a thread that never gets to print
    ctx, buf = log_context()
    with progress.Progress(ctx, "work", 2, "items", every=0.01) as p:
        time.sleep(0.03)
        p.advance(2)
    assert re.fullmatch(r"work: 2/2 items \(100%\), done in 0:00", buf.getvalue().strip()), buf.getvalue()
    ctx, buf = log_context()
    with progress.Progress(ctx, "work", 2, "items", every=30) as p:  # shorter than a period: quiet, as before
        p.advance(2)
    assert buf.getvalue() == ""


def test_progress_on_a_terminal_is_a_bar_with_count_and_eta_and_quiet_is_silent(monkeypatch):
    buf = io.StringIO()
    ctx = Context(console=Console(file=buf, force_terminal=True, width=150))
    with progress.Progress(ctx, "work", 10, "items") as p:
        p.advance(3, info="loss 1.0")
        p._bar.refresh()
        assert "3/10" in buf.getvalue() and "ETA" in buf.getvalue() and "loss 1.0" in buf.getvalue()
    monkeypatch.setattr(progress, "EVERY", 0.001)
    quiet = Context(quiet=True, console=Console(file=io.StringIO()))
    with progress.Progress(quiet, "work", 2) as p:
        time.sleep(0.02)
        p.advance(2)
    assert quiet.console.file.getvalue() == ""
    assert progress.clock(62) == "1:02" and progress.clock(3723) == "1:02:03"


def test_cli_rollout_writes_periodic_progress_lines_to_a_log(tiny_model, tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "title": f"Person {i}", "contents":
                                                          f"Person {i} was born in Paris."}) + "\n" for i in range(3)))
    atom("index", tmp_path / "c.jsonl", "--out", tmp_path / "i.sqlite", check=True)
    qs = tmp_path / "q.jsonl"
    qs.write_text("".join(json.dumps({"id": f"q{i}", "question": f"Who is person {i}?", "golden_answers": ["x"]})
                          + "\n" for i in range(4)))
    proc = atom("rollout", qs, "--model", tiny_model, "--search", f"local:{tmp_path / 'i.sqlite'}", "--group-size",
                2, "--max-new-tokens", 8, "--max-turns", 2, "--batch-size", 2, "--date", "2026-01-01",
                "--out", tmp_path / "r.parquet", env={"ATOM_PROGRESS_EVERY": "0.05", "OMP_NUM_THREADS": "1"},
                check=True)
    err = proc.stderr.decode()
    periodic = re.findall(r"^rollout: (\d)/4 groups \(\d+%\), elapsed \d+:\d\d, ETA .* \| (\d)/8 trajectories .*tok/s",
                          err, re.M)
    assert len(periodic) >= 2, err[-2000:]
    assert [int(g) for g, _ in periodic] == sorted(int(g) for g, _ in periodic)  # counts only go up
    assert re.search(r"^rollout: 4/4 groups \(100%\), done in \d+:\d\d \| 8/8 trajectories", err, re.M), err[-2000:]
    assert "\x1b[" not in err  # no terminal control sequences in a log


def test_sft_reports_steps_and_eta_instead_of_raw_dicts(tiny_model, monkeypatch, capfd):
    import pyarrow as pa

    from atomcli import schema
    from atomcli.stages import sft
    msgs = [[{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": f"<answer>{i}</answer>"}]
            for i in range(4)]
    table = pa.table({"messages": schema.array("messages", msgs)})
    monkeypatch.setattr(progress, "EVERY", 0.02)
    ctx, buf = log_context()
    sft.run(table, sft.SFTConfig(model=str(tiny_model), max_steps=4, batch_size=2, lr=1e-3,
                                 gradient_checkpointing=False), ctx)
    log = buf.getvalue()
    assert re.search(r"^sft: [0-4]/4 steps \(\d+%\), elapsed", log, re.M), log
    assert re.search(r"^sft: 4/4 steps \(100%\), done in \d+:\d\d \| loss \d+\.\d{4}", log, re.M), log
    out, err = capfd.readouterr()
    assert "{'loss'" not in out + err and "'train_runtime'" not in out + err and out == ""


def test_grpo_step_reports_micro_batches(tiny_model, monkeypatch):
    from test_grpo_step import cfg, make_table
    from transformers import AutoTokenizer

    from atomcli.stages import grpo_step
    tok = AutoTokenizer.from_pretrained(tiny_model)
    monkeypatch.setattr(progress, "EVERY", 0.01)
    ctx, buf = log_context()
    grpo_step.run(make_table(tok, n=3), cfg(tiny_model, micro_batch=1, epochs=2, beta=0.1), ctx)
    log = buf.getvalue()
    # 3 micro-batches x (reference pass + 2 updates)
    assert re.search(r"^grpo-step 1: \d/9 micro-batches \(\d+%\), elapsed .*\| (reference log-probs|update)", log,
                     re.M), log
    assert re.search(r"^grpo-step 1: 9/9 micro-batches \(100%\), done in", log, re.M), log


class _SlowJudge:
    name = "slow"

    def __init__(self, takes_progress: bool):
        from atomcli.rewards.judges import HeuristicJudge
        self.inner = HeuristicJudge()
        if takes_progress:
            self.complete = self._complete_reporting

    def complete(self, prompts):
        time.sleep(0.03 * len(prompts))
        return self.inner.complete(prompts)

    def _complete_reporting(self, prompts, progress=None):
        out = []
        for p in prompts:
            time.sleep(0.03)
            out += self.inner.complete([p])
            progress(1)
        return out


@plugins.register_judge("slow-test")
def _slow(arg, context, **_):
    return _SlowJudge(arg == "reporting")


@pytest.mark.parametrize("judge", ["slow-test:reporting", "slow-test:plain"])
def test_score_rrm_reports_trajectories(monkeypatch, judge):
    from test_score_rrm import rollout_table, traj_no_thoughts, traj_two_turns

    from atomcli.stages import score_rrm
    monkeypatch.setattr(progress, "EVERY", 0.01)
    ctx, buf = log_context()
    table = rollout_table([traj_two_turns()] * 6 + [traj_no_thoughts()])
    out = score_rrm.run(table, score_rrm.ScoreConfig(judge=judge), ctx)
    assert out.column("rrm_error").to_pylist() == [None] * 7
    log = buf.getvalue()
    counts = [int(c) for c in re.findall(r"^score-rrm: (\d)/7 trajectories \(\d+%\), elapsed", log, re.M)]
    assert counts and counts == sorted(counts), log
    if judge.endswith("reporting"):
        assert len(set(counts)) >= 3, log  # reply by reply, not all at the end
    assert re.search(r"^score-rrm: 7/7 trajectories \(100%\), done in .*judge errors 0", log, re.M), log


def test_score_ig_reports_trajectories(tiny_model, monkeypatch):
    from test_score_ig import make_table, two_turn_row
    from transformers import AutoTokenizer

    from atomcli.stages import score_ig
    tok = AutoTokenizer.from_pretrained(tiny_model)
    rows = [{**two_turn_row(tok), "traj_id": f"q0/{i}"} for i in range(6)]
    monkeypatch.setattr(progress, "EVERY", 0.005)
    for reuse in (True, False):
        ctx, buf = log_context()
        score_ig.run(make_table(tok, rows, str(tiny_model)), score_ig.IGConfig(reuse_prefix=reuse, batch_size=2), ctx)
        log = buf.getvalue()
        assert re.search(r"^score-ig: 6/6 trajectories \(100%\), done in .*errors 0", log, re.M), log


# --- 3. JSON Lines from search and browse ------------------------------------------------------------

CORPUS = [{"id": "alice", "title": "Alice Smith", "contents": "Alice Smith was born in Paris in 1901. She painted."},
          {"id": "bob", "title": "Bob Jones", "contents": "Bob Jones lives in Paris and Rome and writes novels."},
          {"id": "carol", "title": "Carol White", "contents": "Carol White founded the Lyon observatory."}]


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    d = tmp_path_factory.mktemp("habits-index")
    (d / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    atom("index", d / "c.jsonl", "--out", d / "i.sqlite", check=True)
    return d / "i.sqlite"


def test_search_json_is_one_object_per_result(index):
    proc = atom("search", "Alice born Paris", "--index", index, "-k", "2", "--format", "json", check=True)
    rows = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert len(rows) == 2
    assert all(set(r) == {"query", "rank", "title", "url", "snippet", "score", "id", "cached"} for r in rows)
    assert [r["rank"] for r in rows] == [1, 2] and {r["query"] for r in rows} == {"Alice born Paris"}
    assert rows[0]["id"] == "alice" and rows[0]["title"] == "Alice Smith" and rows[0]["url"] == "local://doc/alice"
    assert "born in Paris" in rows[0]["snippet"]
    assert rows[0]["score"] > rows[1]["score"] > 0
    # nothing found: no lines, exit 0 (like grep's output, jq reads nothing)
    proc = atom("search", "zzzqqq", "--index", index, "--format", "json", check=True)
    assert proc.stdout == b""


def test_browse_json_has_url_status_text_and_what_the_reader_kept(index):
    url = "local://doc/alice"
    proc = atom("browse", url, "--query", "where was Alice born", "--search", f"local:{index}", "--format", "json",
                check=True)
    [row] = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert row["url"] == url and row["status"] == "ok" and row["error"] is None and row["cached"] is False
    assert row["text"].startswith("Alice Smith\n\n") and "born in Paris in 1901" in row["text"]
    assert "born in Paris" in row["kept"] and row["page_chars"] == len(row["text"])
    assert row["kept_chars"] == len(row["kept"]) and row["source"].startswith("local:")
    proc = atom("browse", "local://doc/nobody", "--search", f"local:{index}", "--format", "json")
    assert proc.returncode == 1
    [row] = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert row["status"] == "error" and row["error"] and row["text"] is None and row["kept"] is None


# --- 4 and 5. checkpoints other tools load -------------------------------------------------------------

def test_lora_adapter_loads_from_another_working_directory(tiny_model, tmp_path, monkeypatch):
    from peft import AutoPeftModelForCausalLM
    from test_grpo_step import cfg, load, make_table
    from transformers import AutoTokenizer

    from atomcli.stages import grpo_step
    tok = AutoTokenizer.from_pretrained(tiny_model)
    monkeypatch.chdir(tiny_model.parent)  # the base typed as a relative path, as users do
    result = grpo_step.run(make_table(tok, n=3), cfg(tiny_model.name, lora=True, lora_r=4, lr=1e-2),
                           Context(quiet=True))
    checkpoint.save(result, str(tmp_path / "ckpt"), stage="grpo-step")
    adapter_cfg = json.loads((tmp_path / "ckpt" / "adapter" / "adapter_config.json").read_text())
    assert adapter_cfg["base_model_name_or_path"] == str(tiny_model.resolve())

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    peft_model = AutoPeftModelForCausalLM.from_pretrained(str(tmp_path / "ckpt" / "adapter")).eval()
    merged = load(tmp_path / "ckpt")
    ids = torch.tensor([tok("Who founded Xylo Works?")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(peft_model(ids).logits, merged(ids).logits, atol=1e-5)
        base = load(tiny_model)(ids).logits
        assert not torch.allclose(peft_model(ids).logits, base, atol=1e-5)  # the adapter is applied


def test_checkpoint_tokenizer_names_a_class_transformers_4_knows_and_loads_the_same(tiny_model, tmp_path):
    from transformers import AutoTokenizer
    model, tok = models.load(str(tiny_model))
    checkpoint.save(checkpoint.TrainResult(model=model, tokenizer=tok, step=0, metrics={}, base=str(tiny_model)),
                    str(tmp_path / "ckpt"), stage="sft")
    cfg = json.loads((tmp_path / "ckpt" / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert not isinstance(cfg.get("extra_special_tokens"), list)
    again = AutoTokenizer.from_pretrained(str(tmp_path / "ckpt"))
    original = AutoTokenizer.from_pretrained(str(tiny_model))
    assert cfg["chat_template"] == original.chat_template  # where 4.x before chat_template.jinja looks
    text = "<|im_start|>user\nWho founded <think> Xylo Works? héllo 123</think><|im_end|>\n"
    assert again(text)["input_ids"] == original(text)["input_ids"]
    assert again.decode(again(text)["input_ids"]) == original.decode(original(text)["input_ids"])
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<answer>x</answer>"}]
    assert again.apply_chat_template(msgs, tokenize=False) == original.apply_chat_template(msgs, tokenize=False)
    assert (again.bos_token, again.eos_token, again.pad_token) == (original.bos_token, original.eos_token,
                                                                   original.pad_token)
    # the fingerprint that guards token columns does not change: tables made before still train
    assert models.tokenizer_id(again) == models.tokenizer_id(original)


def test_portable_tokenizer_config_keeps_extra_special_tokens(tiny_model, tmp_path):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    tok.add_special_tokens({"additional_special_tokens": ["<|x1|>", "<|x2|>"]})
    tok.save_pretrained(tmp_path / "t")
    checkpoint.portable_tokenizer_config(tmp_path / "t")
    cfg = json.loads((tmp_path / "t" / "tokenizer_config.json").read_text())
    assert cfg["additional_special_tokens"] == ["<|x1|>", "<|x2|>"] and "extra_special_tokens" not in cfg
    again = AutoTokenizer.from_pretrained(str(tmp_path / "t"))
    text = "a <|x1|> b<|x2|>"
    assert again(text)["input_ids"] == tok(text)["input_ids"]
    assert set(again.all_special_tokens) == set(tok.all_special_tokens)
