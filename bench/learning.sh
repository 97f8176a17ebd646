#!/usr/bin/env bash
# The learning study (bench/LEARNING.md): does GRPO make the SFT agent better, and does Atom-Searcher's
# fused reward beat DeepResearcher's outcome-only reward?
#
#   1. one shared SFT run: the demo world, the demo's SFT, an eval of the SFT checkpoint on all 100 test
#      questions (run-all with steps = 0);
#   2. arm `learn`:   `atom run-all --demo --preset learn` as it is (since session 23: information gain with
#      per-turn credit at alpha = 0.5, evals that answer at the cap)
#   3. arm `fused`:   the preset with Atom-Searcher's reward (ATR from the heuristic RRM, alpha 0.5 -> 0)
#   4. arm `outcome`: the preset with the outcome alone (process = "none": DeepResearcher's reward)
#   5. arm `fused-skip`: the fused reward, but groups whose outcomes all tie get no advantage
#      ([aggregate-reward] flat_outcome = "skip": ATR only ranks trajectories whose F1 differs)
#   6. arm `ig-turn`: information gain as the process reward, with per-turn credit (IGPO-style;
#      [aggregate-reward] process = "ig", credit = "turn"; scored in bf16 autocast like the trainers)
#   7. arms `t07-fused-skip`, `t07-outcome`: the same rewards as fused-skip and outcome with the
#      training rollouts sampled at temperature 0.7 instead of 1.0 (evals are greedy either way)
#   8. arm `fused-kl`: the fused reward with the policy held nearer its SFT start: half the learning
#      rate (1e-5) and a KL term to the SFT checkpoint (beta = 0.04, TRL's old default)
#   9. arm `turns6`: the fused reward with 6 turns per episode in training rollouts and evals instead of 4
#      (a 4-hop question needs 4 searches and an answer: at 4 turns every correct attempt hits the cap,
#      is ill formed and gets reward -1, below any wrong answer); it evaluates the SFT checkpoint itself
#  10. arm `fused-mask`: the fused reward with the samples cut by the turn or context cap masked out
#      ([aggregate-reward] truncated = "mask": advantage 0, left out of their group's statistics)
#  11. arm `fused-fail`: the same samples ranked as wrong answers instead ([aggregate-reward] truncated =
#      "fail": the advantage of an answer with F1 0; the reward column keeps -1)
#  12. arms `fail-t07-bal`, `outcome-fail-t07-bal` (session 19): the fail rule, training on 1- and 2-hop
#      questions only with each hop count every step ([run-all] max_hops = 2, curriculum = "balanced") and
#      rollouts at temperature 0.7; the fused and the outcome-only reward
#  13. arms `note`, `outcome-note` (session 20): the preset (fused / outcome-only) with [rollout]
#      last_turn_note = true: the tool response before the last turn says that turn must answer (in
#      training rollouts and evals; the arm evaluates the SFT checkpoint itself with the note)
#  14. arms `force`, `outcome-force`: the note, and a last turn that still calls a tool is followed by one
#      forced answer turn ([rollout] force_answer = true): no sample ends unanswered at the turn cap
#  15. arm `ig-turn-const` (session 21): the preset with information gain as the process reward and per-turn
#      credit (IGPO), its weight held at alpha = 0.5 every step ([aggregate-reward] schedule = "constant"):
#      the "search again" turn of a 2-hop question earns what its search adds to the golden answer's
#      probability, a 1-hop sample's extra search earns ~0, so the two contexts get different credit
#  16. arm `real-mix` (session 21, with STYLE=stepwise-real): the preset with [run-all] curriculum = "sources":
#      every step draws one question of each data_source (demo 1-hop, demo 2-hop, SQLite 1-hop, SQLite 2-hop),
#      so half of what RL trains on is real text (a shuffled draw gives it a sixth)
#  17. arms `hops4-force`, `outcome-hops4-force` (session 22): the forced answer, with training questions of
#      every hop count (max_hops = 4, each of 1-4 every step) as in the test split, instead of 1-2 only
#  18. arms `rft`, `rft-grpo`, `lr1e4` (session 41): one rejection-sampling round on the demo training
#      questions (every hop count, dev ones never: one sample each at the rollout temperature, the right
#      answers kept, one epoch from the SFT checkpoint at lr 1e-4; atomcli/stages/run_rft.py) instead of the
#      GRPO steps, the same round followed by the preset's GRPO steps, and the preset's GRPO steps at 5x the
#      learning rate (1e-4): at 2e-5, 4 AdamW steps moved the weights 0.023%, the 40-step SFT 0.80%
#  19. (optional) arm `hf`: the fused reward with the hf:smollm2 judge
#
# Every arm is a TOML layered on the current learn preset. Since session 23 the preset's evals answer at the
# cap (the SFT eval too) and its reward is information gain with per-turn credit: the arms named for another
# reward set it explicitly; their earlier reports were evaluated without the forced answer (add [eval]
# last_turn_note = false, force_answer = false to reproduce those). Since session 19 the preset itself has the fail rule,
# the balanced 1-/2-hop draw and rollouts at 0.7, so `fused-fail` and `fail-t07-bal` now equal `fused`, and
# `outcome-fail-t07-bal` equals `outcome` (kept so that earlier sessions' commands still name their arms).
#
# Every arm starts from the same SFT checkpoint, questions, seeds and step count: its run folder is seeded
# with the shared world/, sft/ and the SFT eval, and run-all --resume skips what exists (the same resume
# path that continues a killed run, tested in tests/test_run_all.py). Greedy evals of one checkpoint with
# one rollout configuration are deterministic, so the arms share the SFT eval instead of redoing it.
# Each arm then compares every eval with the SFT eval (paired bootstrap over question ids).
#
#   bench/learning.sh                 # all arms in RUNS=runs/learning (~30 min SFT + ~30-40 min per arm)
#   ARMS=fused bench/learning.sh      # one arm
#   SFT_FROM=runs/x/sft ARMS=fused bench/learning.sh   # arms from an SFT run folder made elsewhere
#                                     # (a run-all with steps = 0 of the learn preset; it is not rerun)
#   TRANSFER=0 ...                    # no real-document evals in the arms (add them later with atom eval)
#   OMP_NUM_THREADS=1 ARMS=a ... & OMP_NUM_THREADS=1 ARMS=b ...   # two arms at once, one core each
#   STYLE=research RUNS=runs/research ...   # the research-style world (issue 20) for the SFT and every arm
#                                     # (also stepwise-real: the stepwise world plus the SQLite train part)
#   EVAL_EVERY=0 ...                  # the arms evaluate only at the end (the preset: also at step 5)
#   EVAL_LIMIT=20 ...                 # demo-test evals on the first 20 questions only (the SFT's and the arms':
#                                     # an arm refuses an SFT run made with another EVAL_LIMIT)
#                                     # for an arm whose measure is the transfer eval
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
RUNS=${RUNS:-runs/learning}
ARMS=${ARMS-"fused outcome"}   # unset: the two ablation arms; ARMS="" (empty): the shared SFT run only
export HF_HUB_OFFLINE=1
mkdir -p "$RUNS"
atom() { "$PY" -m atomcli "$@"; }

TRANSFER=${TRANSFER:-1}
NO_TRANSFER='transfer_test = ""\ntransfer_search = ""\n'
STYLE=${STYLE:-}   # the demo world's style (classic, research, stepwise, stepwise-real): SFT and every arm
STYLE_LINE=""
[[ -z $STYLE ]] || STYLE_LINE=$(printf 'world_style = "%s"\\n' "$STYLE")
if [[ -n "${SFT_FROM:-}" ]]; then
  SFT="$(realpath "$SFT_FROM")"
  [[ -e "$SFT/sft/model.safetensors" && -e "$SFT/eval/sft.parquet" ]] || { echo "SFT_FROM=$SFT_FROM is not a finished SFT run" >&2; exit 2; }
else
  SFT="$RUNS/sft"
  # dev_questions = 0: the dev split is the arm's (the training questions its steps never draw)
  { printf '[run-all]\nsteps = 0\neval_limit = %s\neval_base = false\ndev_questions = 0\n' "${EVAL_LIMIT:-0}"
    printf "$([[ $TRANSFER == 0 ]] && echo "$NO_TRANSFER")$STYLE_LINE"; } > "$RUNS/sft-only.toml"
  # resumable: what exists (world, checkpoint, evals) is kept
  atom run-all --demo --preset learn --config "$RUNS/sft-only.toml" --out "$SFT" $([[ -d "$SFT" ]] && echo --resume) \
    2>&1 | tee -a "$RUNS/sft.log"
fi

# Since session 23 the preset's reward is information gain with per-turn credit; the arms of sessions 13-22,
# named for the reward they measured, say it explicitly so that their names keep their meaning
ATR='process = "atr"\ncredit = "trajectory"\nschedule = "linear"\n'      # Atom-Searcher's fused reward
OUTCOME='process = "none"\ncredit = "trajectory"\nschedule = "linear"\n'  # DeepResearcher's F1-only reward
# Since session 41 the preset trains with one rejection-sampling round and no GRPO steps; the GRPO arms run the
# preset's 8 GRPO steps from the SFT checkpoint without the round, as they did before (sessions 13-40)
GRPO='steps = 8\nrft_rounds = 0\n'
ROUND='rft_rounds = 1\nrft_sources = "demo"\nrft_group_size = 1\n'   # the preset's round (session 41)
arm_config() {  # arm -> the TOML layered on the learn preset
  case "$1" in
    learn)   echo "" ;;   # the preset as it is (session 41: SFT, one rejection-sampling round, no GRPO steps)
    fused)   printf "[run-all]\n${GRPO}[aggregate-reward]\n${ATR}" ;;
    outcome) printf "[run-all]\n${GRPO}[aggregate-reward]\n${OUTCOME}" ;;
    fused-skip) printf "[run-all]\n${GRPO}[aggregate-reward]\n${ATR}flat_outcome = \"skip\"\n" ;;
    real-mix) printf "[aggregate-reward]\n${ATR}[run-all]\n${GRPO}curriculum = \"sources\"\n" ;;
    ig-turn-const) printf "[run-all]\n${GRPO}"; printf '[aggregate-reward]\nprocess = "ig"\ncredit = "turn"\nschedule = "constant"\n[score-ig]\nprecision = "bf16"\n' ;;
    ig-turn) printf "[run-all]\n${GRPO}"; printf '[aggregate-reward]\nprocess = "ig"\ncredit = "turn"\nschedule = "linear"\n[score-ig]\nprecision = "bf16"\n' ;;
    t07-fused-skip) printf "[run-all]\n${GRPO}[aggregate-reward]\n${ATR}flat_outcome = \"skip\"\n[rollout]\ntemperature = 0.7\n" ;;
    t07-outcome) printf "[run-all]\n${GRPO}[aggregate-reward]\n${OUTCOME}[rollout]\ntemperature = 0.7\n" ;;
    fused-kl) printf "[run-all]\n${GRPO}[aggregate-reward]\n${ATR}[grpo-step]\nlr = 1e-05\nbeta = 0.04\n" ;;
    fused-mask) printf "[run-all]\n${GRPO}[aggregate-reward]\n${ATR}truncated = \"mask\"\n" ;;
    fused-fail) printf "[run-all]\n${GRPO}[aggregate-reward]\n${ATR}truncated = \"fail\"\n" ;;
    # session 19: the three changes session 18 left for next, together (fail rule, 1-2 hops, each hop count
    # every step, cooler sampling), with the fused reward and with the outcome alone (the ablation)
    fail-t07-bal) printf "[run-all]\n${GRPO}max_hops = 2\ncurriculum = \"balanced\"\n[aggregate-reward]\n${ATR}truncated = \"fail\"\n[rollout]\ntemperature = 0.7\n" ;;
    outcome-fail-t07-bal) printf "[run-all]\n${GRPO}max_hops = 2\ncurriculum = \"balanced\"\n[aggregate-reward]\n${OUTCOME}truncated = \"fail\"\n[rollout]\ntemperature = 0.7\n" ;;
    # session 20: the preset with the environment's note before the last turn (rollouts and evals):
    # the policy can read the turn budget instead of being cut off by it
    note) printf "[run-all]\n${GRPO}[aggregate-reward]\n${ATR}[rollout]\nlast_turn_note = true\n" ;;
    outcome-note) printf "[run-all]\n${GRPO}[aggregate-reward]\n${OUTCOME}[rollout]\nlast_turn_note = true\n" ;;
    # a last turn that still calls a tool is followed by a forced answer turn (no sample ends unanswered)
    force) printf "[run-all]\n${GRPO}[aggregate-reward]\n${ATR}[rollout]\nlast_turn_note = true\nforce_answer = true\n" ;;
    outcome-force) printf "[run-all]\n${GRPO}[aggregate-reward]\n${OUTCOME}[rollout]\nlast_turn_note = true\nforce_answer = true\n" ;;
    # session 22: the forced answer, and training questions of every hop count like the test split's
    # (each hop count 1-4 every step): the prior on stopping that GRPO learns is the one the test mix needs
    hops4-force) printf "[aggregate-reward]\n${ATR}[run-all]\n${GRPO}max_hops = 4\n[rollout]\nlast_turn_note = true\nforce_answer = true\n" ;;
    outcome-hops4-force) printf "[run-all]\n${GRPO}max_hops = 4\n[aggregate-reward]\n${OUTCOME}[rollout]\nlast_turn_note = true\nforce_answer = true\n" ;;
    turns6) printf "[run-all]\n${GRPO}[aggregate-reward]\n${ATR}[rollout]\nmax_turns = 6\n[eval]\nmax_turns = 6\n" ;;
    # session 41: expert iteration on the demo world, with and without GRPO after it; GRPO at 5x the lr
    rft) printf "[run-all]\nsteps = 0\n${ROUND}" ;;
    rft-grpo) printf "[run-all]\nsteps = 8\n${ROUND}" ;;
    lr1e4) printf "[run-all]\n${GRPO}[grpo-step]\nlr = 0.0001\n" ;;
    hf) printf "[aggregate-reward]\n${ATR}[run-all]\n${GRPO}judge = \"hf:smollm2\"\n" ;;
    *) echo "unknown arm $1 (valid: learn, fused, outcome, fused-skip, ig-turn, ig-turn-const, real-mix, t07-fused-skip, t07-outcome, fused-kl, fused-mask, fused-fail, fail-t07-bal, outcome-fail-t07-bal, note, outcome-note, force, outcome-force, hops4-force, outcome-hops4-force, turns6, rft, rft-grpo, lr1e4, hf)" >&2; exit 2 ;;
  esac
}

for arm in $ARMS; do
  dir="$RUNS/$arm"
  mkdir -p "$dir/eval"
  arm_config "$arm" > "$RUNS/$arm.toml"
  if [[ $TRANSFER == 0 || -n $STYLE || -n ${EVAL_EVERY:-} || -n ${EVAL_LIMIT:-} ]]; then  # merged, not appended: the arm may have a [run-all] section
    "$PY" - "$RUNS/$arm.toml" "$TRANSFER" "$STYLE" "${EVAL_EVERY:-}" "${EVAL_LIMIT:-}" <<'PYEOF'
import sys, tomllib
from atomcli.stages import run_all
path, transfer, style, eval_every, eval_limit = sys.argv[1:6]
with open(path, "rb") as f:
    cfg = tomllib.load(f)
ra = cfg.setdefault("run-all", {})
if transfer == "0":
    ra.update(transfer_test="", transfer_search="")
if style:
    ra["world_style"] = style
if eval_every:
    ra["eval_every"] = int(eval_every)
if eval_limit:
    ra["eval_limit"] = int(eval_limit)
open(path, "w").write(run_all.to_toml(cfg))
PYEOF
  fi
  # the arm's evals are compared with the SFT eval, question by question: the same questions or a refusal
  # (an SFT run made with EVAL_LIMIT=20 and an arm without it would compare 100 answers with 20)
  "$PY" - "$SFT/config.json" "$RUNS/$arm.toml" <<'PYEOF' || exit 2
import json, sys, tomllib
from atomcli.stages import run_all
sft = json.load(open(sys.argv[1])).get("run-all", {}).get("eval_limit", 0)
with open(sys.argv[2], "rb") as f:
    arm = run_all._merge(run_all.LEARN, tomllib.load(f))["run-all"].get("eval_limit", 0)
if sft != arm:
    print(f"error: {sys.argv[1]}: the SFT run's evals have eval_limit = {sft}, this arm's {arm} "
          "(hint: run the SFT and the arms with the same EVAL_LIMIT)", file=sys.stderr)
    sys.exit(2)
PYEOF
  # the shared start: world, SFT checkpoint, the SFT eval's questions and answered table
  [[ -e "$dir/world" ]] || ln -s "$(realpath "$SFT/world")" "$dir/world"
  [[ -e "$dir/sft" ]] || ln -s "$(realpath "$SFT/sft")" "$dir/sft"
  # an arm that evaluates differently (turns6: 6 turns instead of 4; the note arms: the last-turn note)
  # evaluates the SFT checkpoint itself, with its own settings
  own=0; [[ $arm == turns6 || $arm == *note || $arm == *force ]] && own=1
  shared="questions.parquet"; [[ $own == 1 ]] || shared="$shared sft.parquet"
  if [[ $TRANSFER != 0 ]]; then
    [[ -e "$dir/real" ]] || ln -s "$(realpath "$SFT/real")" "$dir/real"
    mkdir -p "$dir/eval/transfer"
    shared="$shared transfer/questions.parquet"; [[ $own == 1 ]] || shared="$shared transfer/sft.parquet"
  fi
  for f in $shared; do
    [[ -e "$dir/eval/$f" ]] || cp "$SFT/eval/$f" "$dir/eval/$f"
  done
  # mark the seeded folder as run-all marks its own (marker + config.json of exactly these settings),
  # so that --resume adopts it: the same functions run-all uses, not a hand-written copy
  [[ -e "$dir/config.json" ]] || "$PY" - "$dir" "$RUNS/$arm.toml" <<'PYEOF'
import sys
from pathlib import Path
from atomcli.context import Context
from atomcli.stages import run_all
out = Path(sys.argv[1])
run_all._mark(out, run_all.prepare(out, True, False, sys.argv[2], Context(quiet=True), "learn", build=False))
PYEOF
  echo "== arm $arm: $(date -u +%FT%TZ)" >&2
  atom run-all --demo --preset learn --config "$RUNS/$arm.toml" --out "$dir" --resume 2>&1 | tee -a "$RUNS/$arm.log"  # -a: a resumed arm keeps the log of its first part
done

# the table of LEARNING.md: every arm's evals against the shared SFT eval
for arm in $ARMS; do
  for rep in "$RUNS/$arm"/eval/step-*.json "$RUNS/$arm"/eval/rft-*.json; do
    [[ -e $rep ]] || continue
    "$PY" - "$arm" "$rep" <<'EOF'
import json, sys
arm, path = sys.argv[1], sys.argv[2]
r = json.load(open(path))
c = r.get("compare", {}).get("overall", {})
f = lambda k: "-" if not c.get(k) else f"{c[k]['diff']:+.3f} [{c[k]['low']:+.3f}, {c[k]['high']:+.3f}]"
print(f"| {arm} | {r['name']} | {r['overall']['f1']:.3f} | {r['overall']['em']:.3f} | {f('f1')} | {f('em')} |")
EOF
  done
done
